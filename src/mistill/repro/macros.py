r"""Stable LaTeX macro names for registered values, derived from result id + value key.

LaTeX command names hold letters only, so digits are spelled out:
``R-C3`` + ``knockin_top40_p1`` -> ``\RCthreeKnockinTopFortyPOne``.  The id's
number is spelled in lower case (it ends the id), every key token is
capitalised, and a digit run with a leading zero is spelled digit by digit
(``lambda001`` -> ``LambdaZeroZeroOne``) so that 001 and 1 stay distinct.
Elements of list values get ``Part<One|Two|...>``.
"""

from __future__ import annotations

import re

_ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
         "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"]
_TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]


def number_words(n: int) -> str:
    """English words for 0 <= n < 10**9, concatenated in lower case (40 -> 'forty', 101 -> 'onehundredone')."""
    if n < 0:
        raise ValueError(n)
    if n < 20:
        return _ONES[n]
    if n < 100:
        return _TENS[n // 10] + (_ONES[n % 10] if n % 10 else "")
    for size, word in ((10**6, "million"), (1000, "thousand"), (100, "hundred")):
        if n >= size:
            head, rest = divmod(n, size)
            return number_words(head) + word + (number_words(rest) if rest else "")
    raise AssertionError(n)


def spell_digits(run: str) -> str:
    """A digit run as a CamelCase word: '40' -> 'Forty', '003' -> 'ZeroZeroThree'."""
    if len(run) > 1 and run.startswith("0"):
        return "".join(_ONES[int(d)].capitalize() for d in run)
    return "".join(part.capitalize() for part in _split_words(number_words(int(run))))


def _split_words(words: str) -> list[str]:
    # number_words concatenates; split back on the vocabulary so each word is capitalised.
    vocab = sorted(set(_ONES + _TENS[2:] + ["hundred", "thousand", "million"]), key=len, reverse=True)
    out, i = [], 0
    while i < len(words):
        for word in vocab:
            if words.startswith(word, i):
                out.append(word)
                i += len(word)
                break
        else:
            raise AssertionError(words)
    return out


def id_prefix(result_id: str) -> str:
    """'R-C3' -> 'RCthree', 'R-D46' -> 'RDfortysix'."""
    match = re.fullmatch(r"R-([A-Z]+)(\d+)", result_id)
    if not match:
        raise ValueError(f"not a result id: {result_id!r}")
    return "R" + match.group(1) + number_words(int(match.group(2)))


def key_words(key: str) -> str:
    """'knockin_top40_p1' -> 'KnockinTopFortyPOne'."""
    out = []
    for token in re.findall(r"[a-zA-Z]+|\d+", key):
        out.append(spell_digits(token) if token.isdigit() else token.capitalize())
    return "".join(out)


def macro_name(result_id: str, key: str, part: int | None = None) -> str:
    """The command name without the backslash; `part` is the 0-based element of a list value."""
    name = id_prefix(result_id) + key_words(key)
    if part is not None:
        name += "Part" + spell_digits(str(part + 1))
    return name
