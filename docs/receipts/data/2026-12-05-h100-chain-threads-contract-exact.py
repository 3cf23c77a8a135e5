"""Scratch: the contract's checks of exactly these names on the GPU.  python3 contract_exact.py NAME..."""
import sys
from tensorfold.contract import registry, run_check
for check in registry():
    if check.name in sys.argv[1:]:
        result = run_check(check, "gpu")
        status = "PASS" if result.passed else "FAIL " + ", ".join(result.failed_cases)
        print(f"{status} {check.name}: {result.cases} cases bit-equal; controls red: {', '.join(result.red_controls)};"
              f" missed: {', '.join(result.missed_controls) or 'none'} ({result.seconds:.1f} s)", flush=True)
