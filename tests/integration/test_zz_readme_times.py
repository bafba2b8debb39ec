from test_readme import readme  # noqa: F401
from pathlib import Path

def test_dump(readme):
    Path("/tmp/readme_stderr.txt").write_text(readme.done.stderr)
    Path("/tmp/readme_stdout.txt").write_text(readme.done.stdout)
