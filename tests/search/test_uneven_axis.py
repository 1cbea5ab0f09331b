"""Uneven pipeline splits are search axes: Llama 3 405B (126 layers) on pp 8 / 16 with or without vpp."""

from comet.config.model import load_model
from comet.search.context import parallel_from_params
from comet.search.space import PARALLEL_AXES, parse_axis, Method


def test_uneven_split_axes_parse_and_resolve():
    axis = parse_axis("parallel", "pp_embedding_as_layer", [True, False], PARALLEL_AXES["pp_embedding_as_layer"],
                      Method.GRID)
    assert axis.values == (True, False)
    model = load_model("llama31_405b")
    for pp, vpp in ((8, 1), (8, 4), (16, 1), (16, 8)):
        par = parallel_from_params({"tp": 8, "pp": pp, "vpp": vpp, "micro_batch": 1,
                                    "schedule": "interleaved_1f1b" if vpp > 1 else "1f1b",
                                    "pp_embedding_as_layer": True, "pp_loss_as_layer": True}, 2048, 8 * pp * 8)
        par = par.resolve(model)
        assert sum(par.chunk_layers(model)) == 126
    first_last = parallel_from_params({"tp": 8, "pp": 16, "pp_first_stage_layers": 7, "pp_last_stage_layers": 7},
                                      2048, 8 * 16 * 8).resolve(model)
    assert first_last.stage_layers(model, 0) == 7 and first_last.stage_layers(model, 1) == 8
