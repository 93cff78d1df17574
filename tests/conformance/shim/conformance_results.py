"""What the conformance runs share: one JUnit file per rank (`--junitxml=...-rank{rank}.xml`),
and the score of a suite across its ranks.

    pytest -p conformance_results --junitxml=DIR/SUITE-rank{rank}.xml ...   # under rrun

    python -m conformance_results score RESULTS_DIR SUITE RANKS   # after the suite ran
"""

import os
import sys
import xml.etree.ElementTree as ET


def rank() -> str:
    for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "RINGREDUCE_RANK"):
        if name in os.environ:
            return os.environ[name]
    return "0"


def name_junit_file_by_rank(config) -> None:
    """Gives each rank its own JUnit file: `{rank}` in --junitxml's path becomes the rank."""
    if config.option.xmlpath:
        config.option.xmlpath = config.option.xmlpath.replace("{rank}", rank())


def pytest_configure(config) -> None:
    """As a plugin (`-p conformance_results`), it only names the JUnit files."""
    name_junit_file_by_rank(config)


def _outcomes(path: str) -> dict[str, str]:
    outcomes = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        outcome = "failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed"
        key = f"{case.get('classname')}::{case.get('name')}"
        if outcomes.get(key) != "failed":  # a teardown error is a second entry of the same test
            outcomes[key] = outcome
    return outcomes


def score(results: str, suite: str, ranks: int) -> int:
    """Prints the suite's score: a test passes when it passed on every rank that ran it and
    no rank failed it; a rank that never reported it (it died, or hung) fails it."""
    per_rank = []
    for rank in range(ranks):
        path = os.path.join(results, f"{suite}-rank{rank}.xml")
        per_rank.append(_outcomes(path) if os.path.exists(path) else {})
    names = sorted(set().union(*per_rank))
    combined = {}
    for name in names:
        seen = [outcomes.get(name, "failed") for outcomes in per_rank]
        combined[name] = "failed" if "failed" in seen else "skipped" if set(seen) == {"skipped"} else "passed"
    counts = {kind: sum(1 for outcome in combined.values() if outcome == kind)
              for kind in ("passed", "failed", "skipped")}
    for name, outcome in combined.items():
        if outcome != "passed":
            print(f"  {outcome:7s} {name.split('::')[-1]}")
    print(f"{suite} at {ranks} ranks: {counts['passed']} of {len(combined)} passed, "
          f"{counts['failed']} failed, {counts['skipped']} skipped")
    return 0 if counts["failed"] == 0 else 1


if __name__ == "__main__":
    if len(sys.argv) != 5 or sys.argv[1] != "score":
        sys.exit("usage: python -m conformance_results score RESULTS_DIR SUITE RANKS")
    sys.exit(score(sys.argv[2], sys.argv[3], int(sys.argv[4])))
