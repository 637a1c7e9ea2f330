"""Run a whole training curriculum, then its closing report: `python scripts/run_curriculum.py [curriculum=...]`.

The same command as `anchormass-curriculum` once the package is installed; the code and its
options are in anchormass/commands/run_curriculum.py.
"""

from anchormass.commands.run_curriculum import cli

if __name__ == "__main__":
    cli()
