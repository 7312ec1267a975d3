"""What the framework suites beside this file share: running checks."""

import time
import traceback


def run_checks(prefix, checks, names):
    """Runs each named check, printing one PASS or FAIL line for it (a check
    that raises fails, and the rest still run); how many failed."""
    failed = 0
    for name in names:
        t = time.monotonic()
        try:
            ok, what = checks[name]()
        except Exception as e:
            ok, what = False, f"{type(e).__name__}: {e}"
            traceback.print_exc(limit=3)
        failed += not ok
        print(f"{'PASS' if ok else 'FAIL'} {prefix}-{name} {what} ({time.monotonic() - t:.1f} s)",
              flush=True)
    return failed
