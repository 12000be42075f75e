"""`mistill rehearsal build <dir>`: the paper profile's chain, ready to run on stand-ins (mistill.rehearsal.build).

    mistill rehearsal build /tmp/rehearsal   -> a working copy with `profile: *rehearsal`, the stand-in
                                               MIMIC-IV release, a Hugging Face cache of tiny models under
                                               the paper's ids and revisions, the fake vLLM, env.sh;
                                               prints the command that runs the chain
"""

from __future__ import annotations


def cmd_build(args) -> int:
    from mistill.rehearsal.build import build_rehearsal

    rehearsal = build_rehearsal(args.dir, repo=args.repo)
    print(f"rehearsal of the paper profile written to {rehearsal.root}")
    print("run it (minutes on a CPU; `mistill repro check` then reports every paper key, failing on values):")
    print(f"  {rehearsal.command}")
    return 0


def register(subparsers) -> None:
    sub = subparsers.add_parser("build", help="write a working copy that runs the paper profile on stand-ins")
    sub.add_argument("dir", help="a new (or empty) directory")
    sub.add_argument("--repo", default=".", help="the repository checkout to copy (default: .)")
    sub.set_defaults(func=cmd_build)
