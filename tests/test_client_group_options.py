"""``--clients.N.FIELD`` sets a field of any client group from the command line (issue #37
item 10: only the last group was editable, ``--clients.1.tasks_per_client 2`` a cryptic error)."""

from __future__ import annotations

import pytest
import yaml

from tests.helpers import run_cli


def test_any_groups_field_is_set_by_its_index(capsys):
    from fedmtl.cli import main

    with pytest.raises(SystemExit) as done:  # --print_config prints the resolved config and exits
        main(
            [
                "fit", "--config", "configs/demo.yaml", "--clients.1.tasks_per_client", "2",
                "--clients.0.optimizer.warmup_epochs=0", "--print_config",
            ]
        )  # fmt: skip
    assert done.value.code in (0, None)
    groups = yaml.safe_load(capsys.readouterr().out)["clients"]
    assert [g["tasks_per_client"] for g in groups] == [None, 2]
    assert [g["optimizer"]["warmup_epochs"] for g in groups] == [0, 1]
    assert [g["optimizer"]["lr"] for g in groups] == [0.001, 0.001]  # the rest as the YAML says


@pytest.mark.parametrize(
    ("option", "line"),
    [
        (
            ["--clients.2.local_epochs", "2"],
            "error: --clients.2.local_epochs: the config has 2 client group(s), clients.0 to clients.1; "
            "use one of those indices, or add a group in the YAML file",
        ),
        (
            ["--clients.0.optimizer.foo=2"],
            "error: --clients.0.optimizer.foo: optimizer has no field 'foo'; its fields: lr, weight_decay, "
            "warmup_epochs, warmup_lr, min_lr, keep_state",
        ),
    ],
)
def test_a_group_or_field_that_does_not_exist_is_one_line(capsys, option, line):
    code, err = run_cli(["fit", "--config", "configs/demo.yaml", *option, "--print_config"], capsys)
    assert code == 1 and err == [line]
