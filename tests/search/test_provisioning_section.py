"""The provisioning section of the study summary: spread at a fixed GPU count and expansion gain,
computed from the rows, next to COMET's figures."""

from types import SimpleNamespace

import pandas as pd

from comet.search.provisioning import provisioning_section, spread_at_fixed_gpus


def frame():
    rows = []
    for gpus in (1024, 2048):
        for bw, exp, days in ((25, 0, 30.0), (100, 0, 20.0), (25, 512, 24.0), (100, 512, 16.0)):
            rows.append({"status": "ok", "gpus": gpus, "scaleout_bandwidth_GBps": bw, "expansion_GB": exp,
                         "time_to_train_days": days * 1024 / gpus, "label": "tp8-pp8", "offload": "none",
                         "step_time_s": 10.0, "breakdown.compute": 8.0, "breakdown.exposed_dp": 2.0})
    return pd.DataFrame(rows)


def test_spread_and_expansion_gain_by_hand(h100):
    df = frame()
    spreads = spread_at_fixed_gpus(df)
    assert [round(s["ratio"], 3) for s in spreads] == [30 / 16, 30 / 16]
    ctx = SimpleNamespace(cluster=h100)
    text = "\n".join(provisioning_section(df, df.head(2), ctx))
    assert "1.88x over 4 designs at 1024 GPUs" in text and "COMET reports up to 7.7x" in text
    # expansion: 30 -> 24 and 20 -> 16 days: up to 1.25x, COMET's 1.4x beside it
    assert "up to **1.25x**" in text and "COMET reports up to 1.4x" in text
    assert "| gpus=1024" in text or "gpus=1024 |" in text
