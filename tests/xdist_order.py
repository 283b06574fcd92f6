"""`make test`'s order of test modules across pytest-xdist workers: the slowest first.

`--dist loadfile` gives each worker whole modules, so a module's real control plane, hub or
demo starts once. xdist hands the modules out by their number of tests, most first: a module
of one long end-to-end test came last (test_overcommit_swap_e2e, test_demo_lab: 2-4 min), and
a run ended with one worker on it while the others had nothing left to do. Handing out the
slowest modules first (longest processing time first) leaves the short ones, which are many,
to fill in at the end, so the workers finish close together.

The controller sees test ids only, not what a module starts, so each module's expected seconds
are written here: rough figures from `--durations` of `make test` on the 2-core CI machine (3
workers), fixtures' set-up and tear-down included. A module not named counts as fast and keeps
xdist's place. A stale figure costs minutes of wall time, never a test: refresh them when a
module gets much slower or faster.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from xdist.scheduler import LoadFileScheduling

#: a real control plane (etcd, kube-apiserver, scheduler, controller-manager) with the node agent:
#: ~20-30 s to start on the loaded CI machine, plus a hub (~30 s) when the module has one
CLUSTER = 60.0
#: a jupyter-server, Chromium or a Docker daemon of the module's own
PROCESSES = 30.0

EXPECTED_SECONDS: dict[str, float] = {
    # `fracspawner demo` started by every test (control plane, hub, culler, services)
    "test_demo.py": 300,
    "test_demo_lab.py": 260,  # the demo's hibernation timings are real: 1 min + 1 min
    "test_demo_terminal.py": 170,
    "test_overcommit_swap_e2e.py": 180,  # eight real single-user servers on one GPU
    "test_browser_admin.py": 170,
    "test_lab_meter.py": 170,
    "test_images.py": 150,  # Docker builds in the fixture
    "test_hub_network.py": 150,
    "test_browser_pending.py": 140,
    "test_lab_presence.py": 120,
    "test_overcommit_admission_e2e.py": 110,
    "test_browser_trust.py": 110,
    "test_culler_hostile.py": 100,
    "test_install_walkthrough.py": 100,
    "test_hub_reflectors_real.py": 90,
    "test_dra_e2e.py": 90,
    "test_admin.py": 90,
    "test_chart.py": 90,
    "test_browser_picker.py": 80,
    "test_layout.py": 60,  # builds an sdist and a wheel from it
    "test_docs.py": 45,  # builds the docs with Sphinx
    **dict.fromkeys(
        [
            "test_browser_quota_unknown.py", "test_browser_xss.py", "test_capacity_outage.py",
            "test_check.py", "test_culler_e2e.py", "test_dra_kubeflow.py",
            "test_dra_kubeflow_e2e.py", "test_e2e_admission.py", "test_e2e_adversarial.py",
            "test_e2e_capacity.py", "test_e2e_quota_nowatch.py", "test_e2e_spawn.py",
            "test_e2e_wait.py", "test_fraction_fit.py", "test_hub_roles.py",
            "test_kubeflow_culler.py", "test_kubeflow_e2e.py", "test_kubeflow_export.py",
            "test_kubeflow_reservations.py", "test_kubeflow_walkthrough.py",
            "test_kubeflow_webhook.py", "test_kubeflow_webhook_callers.py",
            "test_kubeflow_webhook_gpu_env.py", "test_kubeflow_webhook_jobs.py",
            "test_kubeflow_webhook_pools.py", "test_kubeflow_webhook_quota.py",
            "test_kubeflow_webhook_visibility.py", "test_kubeflow_workspacekind_apply.py",
            "test_options.py", "test_overcommit_admission.py", "test_bench_scale_count.py",
            "test_rawwatch.py", "test_rbac_real.py", "test_realcluster.py",
            "test_nodeagent.py", "test_nodeagent_dra_env.py", "test_nodeagent_kubeletapi.py",
            "test_nodeagent_pods.py", "test_nodeagent_containers.py", "test_nodeagent_lifecycle.py",
            "test_controlplane.py", "test_culler_placement_dra.py", "test_hub_reflectors.py",
            "test_e2e_no_gpu.py", "test_e2e_cannot_start.py", "test_kubeflow_guard_counted.py",
            "test_e2e_autoscaler.py",
        ],
        CLUSTER,
    ),
    **dict.fromkeys(
        [
            "test_lab_meter_open.py", "test_lab_meter_oldest.py", "test_overcommit_meter.py",
            "test_presence_session.py", "test_hibernation.py", "test_hibernation_driver.py",
            "test_serverext.py", "test_doctor.py", "test_culler_gpu_unknown.py",
            "test_notebook_image.py", "test_image_versions.py", "test_z2jh.py",
            "test_serverext_late_loop.py",
        ],
        PROCESSES,
    ),
}  # fmt: skip


def expected_seconds(scope: str) -> float:
    """The expected seconds of a work unit (a module's path as xdist names it); 0 if unknown."""
    return EXPECTED_SECONDS.get(PurePosixPath(scope.split("::", 1)[0]).name, 0.0)


def slowest_first(scopes: list[str]) -> list[str]:
    """`scopes` ordered slowest first; equals keep their order (xdist's: most tests first)."""
    return sorted(scopes, key=lambda scope: -expected_seconds(scope))


class SlowestModulesFirst(LoadFileScheduling):
    """`--dist loadfile` handing out the slowest module left each time a worker takes one."""

    def _assign_work_unit(self, node) -> None:
        if self.workqueue:
            self.workqueue.move_to_end(slowest_first(list(self.workqueue))[0], last=False)
        super()._assign_work_unit(node)
