"""The whole gateway stack as child processes on this machine (`local.Stack`): what `kvgate up`
runs, and what `kvgate bench --compare`, the gateway benchmark and the tests start per run."""
