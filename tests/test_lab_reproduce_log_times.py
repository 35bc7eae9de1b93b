"""lab/scripts/reproduce_log_times.py: a job counts in the invocation that did its work; a killed job is 'resumed'."""
import json

from lab.scripts.reproduce_log_times import main, parse

LOG = """.venv/bin/python -m idckit.cli reproduce --profile cpu
[prepare scenes clevr-change] started (profile=cpu, 1 thread(s))
SynthCLEVR-Change:  1%|  | 77/8000 [00:17<24:15,  5.44pair/s][prepare] scenes birds: 18 s
\r[prepare] scenes clevr-change: 900 s
[train pcl/full seed 0] started (profile=cpu, 1 thread(s))
[train pcl/full seed 0] ok in 1062 s
[train pcl/none seed 0] started (profile=cpu, 1 thread(s))
.venv/bin/python -m idckit.cli reproduce --profile cpu
[prepare] scenes clevr-change: 0 s
[train pcl/full seed 0] ok in 0 s
[train pcl/none seed 0] started (profile=cpu, 1 thread(s))
[train pcl/none seed 0] ok in 25 s
[table2_clevr_change] ok in 1133 s
"""


def test_each_job_counts_where_it_ran_and_a_killed_one_is_named():
    out = parse(LOG)
    assert out["costs"] == {"prepare scenes birds": 18.0, "prepare scenes clevr-change": 900.0,
                            "train pcl/full seed 0": 1062.0, "train pcl/none seed 0": 25.0,
                            "table2_clevr_change": 1133.0}
    assert out["invocations"] == 2
    assert out["resumed"] == ["train pcl/none seed 0"]


def test_a_pause_comes_off_the_jobs_it_stopped(tmp_path, capsys):
    log = tmp_path / "reproduce.log"
    log.write_text(LOG)
    main([str(log), "--paused", "100", "prepare scenes clevr-change"])
    out = json.loads(capsys.readouterr().out)
    assert out["costs"]["prepare scenes clevr-change"] == 800.0
    assert out["lane_seconds"] == 18 + 800 + 1062 + 25 + 1133
