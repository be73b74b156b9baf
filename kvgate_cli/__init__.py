"""The application layer: the `kvgate` command table (`main`), `kvgate up` (`up`) and the admin
CLI (`admin`). It imports every other package; none imports it (tests/unit/test_layering.py).
`python -m kvgate_cli` is the `kvgate` command."""
