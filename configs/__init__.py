"""The scenario configs, installed as the package ``fedmtl.configs`` (pyproject.toml maps it to
this folder, the only copy): ``fedmtl fit --config scenario1.yaml`` finds them from any directory
(``fedmtl configs`` lists them)."""
