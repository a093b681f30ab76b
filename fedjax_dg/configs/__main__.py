"""`python -m fedjax_dg.configs list | path NAME[:SETTING] | copy DIR`: the shipped configs
(see `fedjax_dg.configs`)."""
from __future__ import annotations

import argparse
import sys

from fedjax_dg import configs


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog="python -m fedjax_dg.configs", description=configs.__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("command", choices=("list", "path", "copy"),
                 help="list: every shipped config; path: the file of one; copy: all of them into a folder")
  p.add_argument("target", nargs="?", help="path: the config (pacs, sweeps/tiny, pacs:fediir); copy: the folder")
  return p


def main(argv: list[str] | None = None) -> int:
  """Runs the command line.

  Args:
    argv: the arguments after the program name (default `sys.argv[1:]`).

  Returns:
    The exit status: 0, or 2 after a one-line error on stderr.
  """
  args = _parser().parse_args(argv)
  try:
    if args.command == "list":
      rows = [(n, configs.summary(n)) for n in configs.names()]
      width = max(len(n) for n, _ in rows)
      print("\n".join(f"{n:{width}s}  {s}" for n, s in rows))
      print(f"(in {configs.folder()}; run one with: fedjax-dg --config \"$(python -m fedjax_dg.configs path NAME)\")")
    elif not args.target:
      raise configs.ConfigNotFound(f"{args.command}: name the {'config' if args.command == 'path' else 'folder'}, "
                                   f"e.g. python -m fedjax_dg.configs {args.command} "
                                   f"{'default' if args.command == 'path' else 'my_configs'}")
    elif args.command == "path":
      print(configs.path(args.target))
    else:
      written = configs.copy(args.target)
      print(f"copied {len(written)} config files into {args.target}")
  except (configs.ConfigNotFound, OSError) as e:
    print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main())
