"""The prose locus (Sec. 3.4, App. F): where, before the code letter, the chapter is decided.

`probe` walks back from each chapter letter with a forcing suffix; `window` attributes and ablates the
heads over the window before the locus; `passes` runs both over the characterization notes.
"""
