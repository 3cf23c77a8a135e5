"""Scratch: the contract's checks whose names are given, on the GPU."""
import sys
from tensorfold.contract import registry, run_check
for check in registry():
    if check.name in sys.argv[1:]:
        r = run_check(check, "gpu")
        print(("PASS" if r.passed else "FAIL " + ", ".join(r.failed_cases)), check.name, f"{r.cases} cases;",
              "red:", ", ".join(r.red_controls), "; MISSED:", ", ".join(r.missed_controls), f"({r.seconds:.1f} s)",
              flush=True)
