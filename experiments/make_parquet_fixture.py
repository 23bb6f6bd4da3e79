#!/usr/bin/env python3
"""Writes the CI's parquet fixture in verl's dataset layout, as HF `datasets` / pyarrow write it
(snappy-compressed; `prompt` a list of {role, content} structs, `reward_model` a struct with
`ground_truth`, plus the usual `data_source` / `extra_info` columns):

    pip install pyarrow
    python3 experiments/make_parquet_fixture.py trainer/tests/fixtures/datasets/verl_math.parquet
"""
import sys

import pyarrow as pa
import pyarrow.parquet as pq

rows = [("1+1=", "2"), ("2+3=", "5"), ("4+4=", "8"), ("7-2=", "5")]
table = pa.table({
    "data_source": ["lockstep/arithmetic"] * len(rows),
    "prompt": [[{"role": "user", "content": q}] for q, _ in rows],
    "ability": ["math"] * len(rows),
    "reward_model": [{"style": "rule", "ground_truth": a} for _, a in rows],
    "extra_info": [{"split": "train", "index": i} for i in range(len(rows))],
})
pq.write_table(table, sys.argv[1], compression="snappy", row_group_size=2)
