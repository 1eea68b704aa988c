"""Tally the resume contract's cases: every honest state, every tampered one, by verdict.

``tests/test_resume_contract.py`` is the test (hypothesis picks the cases, and CI runs it);
this runs the same cases in full sweeps and counts what happened, so that two versions of
the package can be compared on the same cases:

    python tools/contract_tally.py                 # honest and tampered sweeps, this checkout
    python tools/contract_tally.py --resealed      # tampered states with their digests recomputed
    cd /tmp/other && python /path/to/tools/contract_tally.py   # another checkout's package

``--resealed`` recomputes each tampered state's digests (:func:`pipeflow.resume.state.digests`)
before it is loaded, so that what refuses it is the field checks alone, not the digests
that bind a record to its pipeline, epoch and position.

The package and the cases are imported from the current directory.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections import Counter
from typing import Any

sys.path.insert(0, ".")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="pipelines (default: all)")
    parser.add_argument("--resealed", action="store_true", help="recompute tampered digests")
    args = parser.parse_args()

    import pipeflow.resume.state as state
    from tests import test_resume_contract as contract
    from tests._contract_cases import PIPELINES

    if args.resealed:
        judge = contract.judge

        def resealed(
            pipeline: Any, seed: int, size: int, taken: Any, tampered: Any, *more: Any
        ) -> Any:
            if isinstance(tampered, dict) and isinstance(tampered.get("digests"), dict):
                with contextlib.suppress(Exception):  # too broken to digest: loaded as it is
                    tampered = {**tampered, "digests": state.digests(tampered)}
            return judge(pipeline, seed, size, taken, tampered, *more)

        contract.judge = resealed  # type: ignore[assignment]

    verdicts: Counter[str] = Counter()
    honest = 0
    failures: list[str] = []
    for name in args.names or list(PIPELINES):
        pipeline = PIPELINES[name]
        seed, size = 5, pipeline.sizes[0]
        if not args.resealed:
            for k, ended in contract.steps(pipeline, seed, size):
                honest += 1
                failure = contract.honest_failure(pipeline, seed, size, k, ended)
                if failure:
                    failures.append(f"{name}: honest: {failure}")
        k = contract.middle(name, seed, size)
        for mutation, outcome in contract.check_tampered(name, seed, size, k):
            verdicts[outcome.verdict] += 1
            if outcome.failed:
                failures.append(f"{name} [{outcome.verdict}] {mutation} | {outcome.detail[:160]}")
    if not args.resealed:
        print(f"honest states: {honest}")
    print(f"tampered states: {sum(verdicts.values())} {dict(sorted(verdicts.items()))}")
    print(f"failures: {len(failures)}")
    for line in failures:
        print("  ", line)


if __name__ == "__main__":
    main()
