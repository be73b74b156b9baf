"""Regular expressions over decimal numbers: Envoy's matchers compare header values as strings,
so "Content-Length at most N" has to be spelled as a regex (RE2, full match)."""

from __future__ import annotations


def at_most(limit: int) -> str:
    """A regex matching exactly the decimal integers 0..limit (leading zeros allowed)."""
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    digits = str(limit)
    width = len(digits)
    choices = ["0"]
    if width > 1:  # every number with fewer digits
        choices.append("[1-9]" if width == 2 else f"[1-9][0-9]{{0,{width - 2}}}")
    # Numbers of the same width: equal to `limit` up to position i, lower at i, anything after.
    for i, digit in enumerate(digits):
        low = 1 if i == 0 else 0
        high = int(digit) - 1
        if high < low:
            continue
        rest = width - i - 1
        span = str(low) if low == high else f"[{low}-{high}]"
        choices.append(digits[:i] + span + (f"[0-9]{{{rest}}}" if rest else ""))
    choices.append(digits)
    return "0*(?:" + "|".join(dict.fromkeys(choices)) + ")"
