"""Every count of kernels and controls that the README and the documentation's pages state equals the kernel
contract's registry, and every GPU receipt stays reachable from the documentation.

The pages under docs/history/ record past runs, with the counts of their day, and are left out of the count check.
The checker is also run on a planted wrong count, which it must report."""
import re
from pathlib import Path

from tensorfold.contract import registry

ROOT = Path(__file__).resolve().parents[1]

# "31 kernels", "31 kernel checks", "93 controls", "93 planted controls" (a number may be split from its noun by
# a line break, and may carry thousands separators)
COUNT = re.compile(r"\b(\d[\d,]*)\s+(?:planted\s+)?(kernels|kernel\s+checks|controls)\b")
# the summary line of `tensorfold contract`, whose other numbers must agree with its counts
SUMMARY = re.compile(r"SUMMARY (\d+) kernels: (\d+) pass, (\d+) fail; (\d+) controls: (\d+) red as planted, (\d+) missed")


def registry_counts() -> dict:
    checks = registry()
    return {"kernels": len(checks), "controls": sum(len(check.controls) for check in checks)}


def wrong_counts(text: str, counts: dict) -> list:
    """Each count in `text` that differs from `counts`, as (line number, phrase, the right number); and each
    `tensorfold contract` summary line that does not read as a green run of those counts."""
    found = []
    for match in COUNT.finditer(text):
        noun = "kernels" if match.group(2).startswith("kernel") else "controls"
        stated = int(match.group(1).replace(",", ""))
        if stated != counts[noun]:
            line = text.count("\n", 0, match.start()) + 1
            found.append((line, " ".join(match.group(0).split()), counts[noun]))
    for match in SUMMARY.finditer(text):
        kernels, passed, failed, controls, red, missed = (int(g) for g in match.groups())
        if (passed, failed, red, missed) != (kernels, 0, controls, 0):
            line = text.count("\n", 0, match.start()) + 1
            found.append((line, match.group(0), "a green run: every kernel passing, every control red"))
    return found


def pages() -> list:
    return [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.rst"))


def test_stated_counts_equal_the_registry():
    counts = registry_counts()
    problems = {str(page.relative_to(ROOT)): wrong_counts(page.read_text(), counts) for page in pages()}
    problems = {page: found for page, found in problems.items() if found}
    assert not problems, f"counts that differ from the registry's {counts}: {problems}"


def test_the_readme_states_the_counts():
    """The README keeps the summary line of a green run, so that its counts are checked rather than absent."""
    counts = registry_counts()
    summaries = SUMMARY.findall((ROOT / "README.md").read_text())
    assert summaries, "README.md has no `SUMMARY N kernels: ...` line"
    assert all(int(kernels) == counts["kernels"] and int(controls) == counts["controls"]
               for kernels, _, _, controls, _, _ in summaries)


def test_control_a_wrong_count_is_reported():
    counts = {"kernels": 31, "controls": 93}
    right = "The contract registers 31 kernels and 93\nplanted controls: SUMMARY 31 kernels: 31 pass, 0 fail; " \
            "93 controls: 93 red as planted, 0 missed"
    assert wrong_counts(right, counts) == []
    wrong = "Every one of the 23 kernel checks\nand 49 planted controls; SUMMARY 31 kernels: 30 pass, 1 fail; " \
            "93 controls: 93 red as planted, 0 missed"
    found = wrong_counts(wrong, counts)
    assert [(line, phrase) for line, phrase, _ in found[:2]] == [(1, "23 kernel checks"), (2, "49 planted controls")]
    assert len(found) == 3 and found[2][1].startswith("SUMMARY 31 kernels: 30 pass")


def test_every_receipt_is_shown_in_the_documentation():
    receipts = sorted(path.name for path in (ROOT / "docs" / "receipts").glob("*.md"))
    shown = set(re.findall(r"literalinclude:: \.\./receipts/(\S+\.md)", (ROOT / "docs/history/receipts.rst").read_text()))
    assert receipts and not set(receipts) - shown, f"receipts not in docs/history/receipts.rst: {set(receipts) - shown}"
    assert not shown - set(receipts), f"receipts.rst includes files that are not there: {shown - set(receipts)}"
