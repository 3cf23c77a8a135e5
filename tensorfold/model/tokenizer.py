"""Text <-> token ids, and chat messages -> prompt text, for Qwen3.5 checkpoints.

The tokenizer is the checkpoint's own `tokenizer.json`, run by the `tokenizers` library; the chat template is the
checkpoint's own Jinja template, rendered the way transformers renders it (sandboxed, trim_blocks, lstrip_blocks,
`raise_exception`, a non-escaping `tojson`), so a prompt is byte-identical to the reference one.
`train_bpe_tokenizer` builds a small tokenizer of the same kind for the tiny test model.
"""

import json
from pathlib import Path

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers, trainers
from tokenizers import Tokenizer as HFTokenizer

from tensorfold.errors import CheckpointError
from tensorfold.model.files import (
    MAX_JSON_BYTES,
    MAX_TOKENIZER_BYTES,
    brief,
    one_line,
    read_checkpoint_file,
    read_json_object,
)

CHATML_TEMPLATE = Path(__file__).with_name("chatml.jinja")
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2 of a trained tokenizer
ADDED_TOKENS = ("<think>", "</think>", "<tool_call>", "</tool_call>")  # single tokens that survive skip_special_tokens
MODEL_MAX_LENGTH = 262144  # the context length Qwen3.5 checkpoints declare


class Tokenizer:
    """tokenizer.json through `tokenizers`, the checkpoint's own chat template through jinja2."""

    def __init__(self, tokenizer: HFTokenizer, chat_template: str | None, stop_ids: tuple[int, ...]):
        self._tokenizer = tokenizer
        self.vocab_size: int = tokenizer.get_vocab_size(with_added_tokens=True)
        self.stop_ids: tuple[int, ...] = stop_ids
        self.chat_template: str | None = chat_template  # None: the checkpoint ships no template
        self._template = compile_chat_template(chat_template) if chat_template is not None else None

    @classmethod
    def from_folder(cls, folder, eos_token_ids=()) -> "Tokenizer":
        """Load a checkpoint folder's tokenizer; `eos_token_ids` (config.json's) are merged into the stop ids.

        Every file is checked here, at load time: a tokenizer.json that `tokenizers` cannot read, a malformed
        generation_config.json or a chat template that does not compile raises CheckpointError naming the file.
        """
        folder = Path(folder)
        path = folder / "tokenizer.json"
        data = read_checkpoint_file(path, MAX_TOKENIZER_BYTES, missing_ok=True)
        if data is None:
            raise CheckpointError(f"{path} is missing: the checkpoint has no tokenizer")
        try:
            tokenizer = HFTokenizer.from_str(data.decode("utf-8"))
        except Exception as e:  # noqa: BLE001 (`tokenizers` raises a plain Exception for every malformed file)
            raise CheckpointError(f"{path} is not a tokenizer that the tokenizers library can read: "
                                  f"{one_line(str(e))}") from None
        generation_path = folder / "generation_config.json"
        generation_config = read_json_object(generation_path, missing_ok=True) or {}
        stop_ids = dict.fromkeys([*eos_token_ids, *as_ids(generation_config.get("eos_token_id"), generation_path)])
        template, template_path = read_chat_template(folder)
        try:
            return cls(tokenizer, template, tuple(stop_ids))
        except (jinja2.TemplateError, RecursionError) as e:
            raise CheckpointError(f"{template_path}: the chat template does not compile: {template_error(e)}") from None

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; no BOS is added, and special-token text such as ``<|im_start|>`` becomes its id."""
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        """The text of `ids`; special tokens are dropped if `skip_special_tokens`."""
        ids = [int(i) for i in ids]  # NumPy integers are not accepted by `tokenizers`
        return self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def to_json(self) -> str:
        """The tokenizer as tokenizer.json text (what a grammar library reads to build its own)."""
        return self._tokenizer.to_str()

    def apply_chat_template(self, messages, add_generation_prompt=True, tools=None, tokenize=False,
                            continue_final_message=False, **kwargs):
        """Render `messages` (and `tools`) to prompt text, or its ids if `tokenize`.

        With `continue_final_message` (and no generation prompt) the text ends right after the last message's
        content, left open for the model to continue, as in `transformers`. Extra keyword arguments (such as
        `enable_thinking`) are passed to the template. A template's `raise_exception` raises
        `jinja2.TemplateError`; a final message that cannot be continued raises ValueError.
        """
        if self._template is None:
            raise CheckpointError("the checkpoint has no chat template (no chat_template.jinja, and no "
                                  "chat_template in tokenizer_config.json)")
        if continue_final_message and add_generation_prompt:
            raise ValueError("continue_final_message and add_generation_prompt cannot both be true")
        text = self._template.render(messages=messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                     **kwargs)
        if continue_final_message:
            text = open_final_message(text, messages[-1].get("content") if messages else None)
        return self.encode(text) if tokenize else text

    def decoder(self, skip_special_tokens: bool = False) -> "StreamDecoder":
        """An incremental detokenizer for printing text as it is produced."""
        return StreamDecoder(self, skip_special_tokens)


class StreamDecoder:
    """Turns token ids, one at a time, into text that is safe to print.

    A character can span several byte-level tokens; until its last byte arrives the decoded text ends with
    U+FFFD, and that text is held back. Only a short window is re-decoded per token: the ids from the last
    printed boundary (`prefix`) on, minus the text of the ids up to `read`, which was already printed.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self.prefix = 0  # ids[prefix:read] decode to text that ends on a character boundary
        self.read = 0  # ids[:read] have been printed

    def push(self, token_id: int) -> str:
        """Add one token; return the text it completes (often all of it, sometimes "")."""
        self.ids.append(int(token_id))
        printed = self._decode(self.ids[self.prefix:self.read])
        text = self._decode(self.ids[self.prefix:])
        if len(text) <= len(printed) or text.endswith("\ufffd"):
            return ""  # an incomplete character: wait for its next byte
        self.prefix, self.read = self.read, len(self.ids)
        return text[len(printed):]

    def flush(self) -> str:
        """Return whatever is held back (an incomplete character decodes as U+FFFD)."""
        printed = self._decode(self.ids[self.prefix:self.read])
        text = self._decode(self.ids[self.prefix:])
        self.prefix = self.read = len(self.ids)
        return text[len(printed):]

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)


def open_final_message(text: str, content) -> str:
    """`text` cut right after the last occurrence of the final message's text (the last text part of a list), so
    that whatever the template writes to close the message is gone; as `transformers` does, trailing spaces that
    the template trimmed stay trimmed."""
    if isinstance(content, list):
        content = next((part["text"] for part in reversed(content) if isinstance(part, dict) and "text" in part), None)
    if not isinstance(content, str) or not content.strip():
        raise ValueError("continue_final_message needs a final message with text to continue")
    at = text.rfind(content.strip())
    if at < 0:
        raise ValueError("continue_final_message: the chat template does not write the final message's text as it "
                         "is, so it cannot be continued")
    whole = text[at:at + len(content.lstrip())] == content  # the template kept the message's trailing spaces
    return text[:at + len(content.lstrip() if whole else content.strip())]


def compile_chat_template(source: str) -> jinja2.Template:
    """Compile a chat template in the environment transformers renders templates in."""

    def raise_exception(message):
        raise jinja2.TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # Jinja's own tojson escapes HTML characters, which would change the prompt.
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env.from_string(source)


def read_chat_template(folder: Path) -> tuple[str | None, Path]:
    """The chat template and the file it came from: chat_template.jinja, else tokenizer_config.json's
    `chat_template` (a string, or a list of named templates of which "default" is taken)."""
    path = folder / "chat_template.jinja"
    data = read_checkpoint_file(path, MAX_JSON_BYTES, missing_ok=True)
    if data is not None:
        try:
            return data.decode("utf-8"), path
        except UnicodeDecodeError as e:
            raise CheckpointError(f"{path} is not UTF-8 text: {e}") from None
    path = folder / "tokenizer_config.json"
    template = (read_json_object(path, missing_ok=True) or {}).get("chat_template")
    if isinstance(template, list):
        named = {entry.get("name"): entry.get("template") for entry in template if isinstance(entry, dict)}
        template = named.get("default")
    if template is not None and not isinstance(template, str):
        raise CheckpointError(f"{path}: chat_template must be a string or a list of named templates, got "
                              f"{brief(template)}")
    return template, path


def as_ids(value, path) -> list[int]:
    """An eos_token_id field (None, an int or a list of ints) as a list; anything else is refused, naming `path`."""
    if value is None:
        return []
    ids = value if isinstance(value, (list, tuple)) else [value]
    for token_id in ids:
        if not isinstance(token_id, int) or isinstance(token_id, bool) or token_id < 0:
            raise CheckpointError(f"{path}: eos_token_id must be a non-negative integer or a list of them, got "
                                  f"{brief(value)}")
    return list(ids)


def template_error(error: Exception) -> str:
    """A Jinja compile error in one line: its message and, for a syntax error, the line of the template."""
    if isinstance(error, RecursionError):
        return "it nests blocks too deeply"
    line = f" (line {error.lineno})" if isinstance(error, jinja2.TemplateSyntaxError) else ""
    return f"{one_line(str(error.message))}{line}"


def train_bpe_tokenizer(texts: list[str], vocab_size: int, folder) -> None:
    """Train a byte-level BPE on `texts` and write it as a checkpoint's tokenizer files into `folder`.

    Special tokens come first (ids 0, 1, 2), then the 256 byte symbols and the learned merges, then the added
    tokens. The same inputs always give the same files.
    """
    tokenizer = HFTokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
                                  initial_alphabet=sorted(pre_tokenizers.ByteLevel.alphabet()))
    tokenizer.train_from_iterator(texts, trainer)
    tokenizer.add_tokens([AddedToken(token, special=False, normalized=False) for token in ADDED_TOKENS])

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    template = CHATML_TEMPLATE.read_text(encoding="utf-8")
    (folder / "chat_template.jinja").write_text(template, encoding="utf-8")
    eos, pad = tokenizer.token_to_id("<|im_end|>"), tokenizer.token_to_id("<|endoftext|>")
    write_json(folder / "tokenizer_config.json", {
        "chat_template": template, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": MODEL_MAX_LENGTH})
    write_json(folder / "generation_config.json", {"eos_token_id": [eos, pad], "pad_token_id": pad})


def write_json(path: Path, value: dict) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
