"""`specdec bench`'s host_steal_share: the CPU time the hypervisor gave to other machines."""

from __future__ import annotations

from specdec.bench import cpu_ticks, steal_share


def test_steal_share_is_stolen_over_all_ticks_between_two_readings(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  1000 0 200 500 10 0 5 100 0 0\ncpu0 500 0 100 250 5 0 2 50 0 0\n")
    start = cpu_ticks(stat)
    assert start == (100, 1815)
    # 300 ticks later: 120 of them user, 30 system, 50 idle, 100 stolen.
    stat.write_text("cpu  1120 0 230 550 10 0 5 200 0 0\n")
    assert steal_share(start, cpu_ticks(stat)) == round(100 / 300, 3)


def test_no_figure_without_proc_stat_or_without_ticks_between(tmp_path):
    assert cpu_ticks(tmp_path / "missing") is None
    assert steal_share(None, (1, 2)) is None
    assert steal_share((1, 2), (1, 2)) is None
