"""The paper profile rehearsed on stand-ins (DESIGN "The paper profile is rehearsed"): `mistill rehearsal build`."""
