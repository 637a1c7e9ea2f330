"""Only what pyproject.toml cannot say: the top-level configs/ folder ships inside the package as
anchormass/configs/ (one copy in the repository, found by anchormass.utils.CONFIG_ROOT when
installed), and the Optuna sweeper plugin goes where Hydra looks for plugins. Metadata,
dependencies and console scripts are in pyproject.toml."""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["anchormass", "anchormass.*"]), "anchormass.configs",
              "hydra_plugins.anchormass_sweeper"],
    package_dir={"anchormass.configs": "configs"},
    package_data={"anchormass.configs": ["**/*.yaml"]},
)
