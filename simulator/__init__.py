"""`kvgate simulate`: a discrete-event simulation of a fleet behind each routing mode, with the
emulator's engine and DDR-pool models and the gateway's own placement code."""
