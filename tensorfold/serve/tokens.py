"""The bytes of a token, which logprobs report: a token may hold only part of a UTF-8 character, so its text (with
U+FFFD for the missing part) does not give them."""


def byte_symbols() -> dict:
    """Byte-level BPE's alphabet: the character that stands for each byte in a token's string."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)}
    extra = iter(range(256, 512))
    return {chr(b if b in printable else next(extra)): b for b in range(256)}


SYMBOLS = byte_symbols()


class TokenBytes:
    """token id -> its bytes: read from the token's byte-level string; added tokens and tokenizers that are not
    byte-level give the UTF-8 of the token's text."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        hf = tokenizer._tokenizer  # the token strings, which the wrapper's whole-text API does not show
        self.id_to_token = hf.id_to_token
        self.added = set(hf.get_added_tokens_decoder())
        self.byte_level = type(hf.decoder).__name__ == "ByteLevel"

    def __call__(self, token: int) -> list:
        piece = self.id_to_token(token) if self.byte_level and token not in self.added else None
        if piece and all(c in SYMBOLS for c in piece):
            return [SYMBOLS[c] for c in piece]
        return list(self.tokenizer.decode([token]).encode())


def encode(tokenizer, text: str) -> list:
    """`tokenizer.encode(text)`, through the batch form of `tokenizers`, which lets go of the GIL while it works:
    a long prompt tokenized on a worker thread then leaves the event loop free."""
    return tokenizer._tokenizer.encode_batch([text], add_special_tokens=False)[0].ids
