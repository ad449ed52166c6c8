"""The rank-table format reads a valid table and names the field of a defect."""

import pytest
from xccl.plugin import RankTableError

from xccl_template._ranktable import TemplateRankTable

GOOD = {"template_rank_table": "1.0",
        "nodes": [{"host": "10.0.0.1", "devices": [{"device_id": 0, "rank": 0}, {"device_id": 1, "rank": 1}]}]}


def test_a_valid_table_parses() -> None:
    fmt = TemplateRankTable()
    assert fmt.detect(GOOD)
    assert fmt.parse(GOOD, "t.json").world_size() == 2


def test_a_repeated_rank_names_its_field() -> None:
    bad = {**GOOD, "nodes": [{"devices": [{"device_id": 0, "rank": 0}, {"device_id": 1, "rank": 0}]}]}
    with pytest.raises(RankTableError) as err:
        TemplateRankTable().parse(bad, "t.json")
    assert err.value.field == "nodes[0].devices[1].rank"
