"""`kvgate up`: the whole stack on one machine."""
