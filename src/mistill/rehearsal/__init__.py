"""The paper profile rehearsed on stand-ins (docs/design.md "The paper profile is rehearsed"): `mistill rehearsal build`."""
