"""The wheel carries the jobs and configs (with the WPR recording profiles) as package data, in
``pipeline/shipped/`` (:mod:`pipeline.packaged`), copied from the project's ``jobs/`` and ``configs/`` as it is
built; everything else is in ``pyproject.toml``."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


class BuildWithShipped(build_py):
    def run(self):
        super().run()
        for kind in ("jobs", "configs"):
            target = Path(self.build_lib) / "pipeline" / "shipped" / kind
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(HERE / kind, target)


setup(cmdclass={"build_py": BuildWithShipped})
