"""`comet export astra-sim CONFIG.yaml [-o DIR]`: one candidate (the keys of `comet estimate --config`:
model, cluster and the parallel fields) as ASTRA-sim inputs: the Chakra ET of every rank that differs,
network.yml, system.json, remote_memory.json and ranks.json (comet/export/astra_sim.py)."""

from __future__ import annotations

import json

from comet.api import DEFAULT_CLUSTER, parallel_config
from comet.config.cluster import load_cluster
from comet.config.model import load_model
from comet.errors import ConfigError


def register(sub) -> None:
    p = sub.add_parser("export", help="export one candidate to another simulator (astra-sim)", description=__doc__)
    p.add_argument("target", choices=["astra-sim"], help="what to export to")
    p.add_argument("config", metavar="CONFIG.yaml", help="model, cluster and parallel fields, as for estimate --config")
    p.add_argument("-o", "--out", default="astra_sim_export", help="output folder (default: astra_sim_export)")
    p.add_argument("--prefix", default="comet", help="ET file prefix: <prefix>.<rank>.et")
    p.set_defaults(func=run)


def run(a) -> int:
    from comet.cli.estimate import _read_config   # the same keys and checks as `comet estimate --config`
    from comet.evaluate import resolve
    from comet.export.astra_sim import export
    req = _read_config(a.config)
    if "model" not in req or "global_batch" not in req:
        raise ConfigError("required keys: model, global_batch", source=a.config)
    model = load_model(str(req.pop("model")))
    cluster = load_cluster(req.pop("cluster", DEFAULT_CLUSTER))
    req.pop("total_tokens", None)
    par = resolve(model, cluster, parallel_config(req, a.config))
    written = export(model, cluster, par, a.out, a.prefix)
    print(json.dumps({"candidate": par.label(), "gpus": par.gpus, **{k: v for k, v in written.items() if k != "et"},
                      "et_files": len(written["et"]), "et_dir": f"{a.out}/et"}, indent=1))
    return 0
