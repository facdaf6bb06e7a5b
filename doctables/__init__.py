"""The scripts that write the README's and docs/' tables from the code and committed data alone
(no timing, no real engine), each run as `python -m doctables.NAME [--markdown | --readme]`.

`--markdown` prints a script's tables between their markers; `--readme` also writes each between
its markers in README.md or docs/ (`rlsim.package_data.markers`). `tests/test_readme_tables.py`
re-runs those that finish in a minute or two and holds each table equal to their output. The
benchmarks that measure (timings, real engines, a GPU) are `benchmarks/`; the two packages do not
import each other, and the tests may import these scripts but never a benchmark.
"""
