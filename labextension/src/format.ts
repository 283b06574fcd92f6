/**
 * The words the meter shows: pure functions of the server extension's report and the time.
 */

/** One coming cull, as `GET /api/fracspawner/gpu` reports it in `warnings`. */
export interface IGpuWarning {
  scope: 'kernel' | 'server';
  kernel_id?: string;
  gpu_memory_mib: number;
  idle_since: string;
  idle_seconds: number;
  limit_seconds: number;
  cull_at: string;
  /** A server's: the culler's rule (culler/decide.py server_deadlines). */
  reason?: 'max_age' | 'unattended' | 'gpu_idle' | 'idle';
}

/** A kernel's GPU hibernation, as the report has it (`kernels[].hibernation`). */
export interface IKernelHibernation {
  state: string; // running | hibernating | hibernated | resuming | restore_failed | failed | cannot_hibernate
  reason?: string | null;
  hibernated_gpu_memory_mib?: number;
  restore_error?: string | null;
  next_retry?: string | null;
  last_resume_seconds?: number | null;
  last_resumed_at?: string | null;
  /** What asked for the hibernation: "idle", or the culler's swap reason (over-commit). */
  hibernated_why?: string | null;
  /** Its resume waits for room on the GPU (serverext/room.py, swap.py), since when and why. */
  waiting_for_gpu?: boolean;
  waiting_since?: string | null;
  waiting_why?: string | null;
  /** The driver refused a restore for want of room (NVIDIA/cuda-checkpoint#44). */
  gpu_state_at_risk?: boolean;
  /** A restore called then has not returned (NVIDIA/cuda-checkpoint#17). */
  restore_stalled_since?: string | null;
}

/** The parts of the report the meter reads (docs/serverext.md has all of it). */
export interface IGpuReport {
  available: boolean;
  reason?: string;
  source?: string;
  poll_interval?: number;
  devices?: { name: string; memory_total_mib: number }[];
  /**
   * `counts_hibernated`: the slice's limit still counts hibernated kernels' memory (HAMi-core
   * counts what the pod allocated until its process exits; hibernating frees none of it).
   */
  slice?: { label: string | null; memory_mib: number | null; counts_hibernated?: boolean };
  gpu_memory_mib?: number;
  /**
   * What the server's devices have free by their own reading, where other pods share them
   * (time-slicing, MPS, over-commit; null elsewhere): less than the slice has left means an
   * allocation fails with CUDA out of memory before the slice is full.
   */
  device_free_mib?: number | null;
  /** Whose reading that is: the devices' NVML, or the culler's count where HAMi-core shows
   * the pod only its slice. */
  device_free_by?: 'nvml' | 'culler' | null;
  gpu_utilization?: number | null;
  warnings?: IGpuWarning[];
  /** `gpu_memory_mib`: what the kernel's process holds on the GPU now (while it hibernates,
   * what is being copied to host memory). */
  kernels?: { id: string; gpu_memory_mib?: number; hibernation?: IKernelHibernation }[];
  hibernated_gpu_memory_mib?: number;
  hibernation?: { simulated?: boolean };
}

/** What the meter says about hibernated kernels; null when none is suspended. */
export interface IHibernationText {
  short: string;
  sentence: string;
  failed: boolean;
  /**
   * Whether the meter offers Resume: not while a copy is under way (to host memory or back:
   * pressing it would only wait for the copy), nor once the state is lost (only a restart helps).
   */
  resumable: boolean;
}

const SUSPENDED = ['hibernating', 'hibernated', 'resuming', 'restore_failed'];

/**
 * 'GPU hibernated: resumes when you run a cell', with how long resuming took last time; while
 * a copy is under way, 'GPU hibernating: moving 9 GiB to host memory' or 'GPU resuming:
 * bringing 9 GiB back from host memory' (a cell run meanwhile waits for it; no Resume
 * button then, `resumable`: it would only wait for the copy too); or, while a
 * restore keeps failing, that it is retried (and, once the driver lost a kernel's GPU
 * state, that only a restart helps). The demo's simulated
 * GPU hibernates with a simulated driver: the words say so, as its readings do.
 */
export function hibernationText(report: IGpuReport, now: Date): IHibernationText | null {
  const said = hibernationWords(report, now);
  // the driver is simulated (the demo's), not only the readings (tests read files too)
  if (!said || !report.hibernation?.simulated) {
    return said;
  }
  return {
    ...said,
    short: said.short.replace(/^GPU /, 'Simulated GPU '),
    sentence: `Simulated (the demo has no GPU): ${said.sentence}`
  };
}

function hibernationWords(report: IGpuReport, now: Date): IHibernationText | null {
  // the driver left the kernel's CUDA state FAILED: terminal, only a restart helps
  const lost = (report.kernels ?? []).find(k => k.hibernation?.state === 'failed');
  if (lost) {
    const error = lost.hibernation?.restore_error ?? 'its state is FAILED';
    return {
      short: 'GPU state lost: restart the kernel',
      sentence: error.startsWith("the kernel's GPU state was lost")
        ? `The kernel's GPU state was lost: restart the kernel. (${error})`
        : `The CUDA driver could not bring this kernel's GPU state back (${error}): ` +
          'its GPU data may be lost. Restart the kernel to use the GPU again.',
      failed: true,
      resumable: false
    };
  }
  const kernels = (report.kernels ?? []).filter(k =>
    SUSPENDED.includes(k.hibernation?.state ?? '')
  );
  const resumed = (report.kernels ?? [])
    .map(k => k.hibernation)
    .filter(h => h?.last_resumed_at && h.last_resume_seconds !== null)
    .sort((a, b) => (a!.last_resumed_at! < b!.last_resumed_at! ? 1 : -1))[0];
  const last = resumed
    ? ` (last resume took ${resumed.last_resume_seconds!.toFixed(1)}\u00a0s, ` +
      `${formatClock(new Date(resumed.last_resumed_at!), now)})`
    : '';
  if (!kernels.length) {
    return null;
  }
  const stalled = kernels.find(k => k.hibernation?.restore_stalled_since);
  if (stalled) {
    const since = formatClock(new Date(stalled.hibernation!.restore_stalled_since!), now);
    return {
      short: 'GPU restore not returning',
      sentence:
        "The CUDA driver's restore of this kernel's GPU state has not returned (it can " +
        `block: NVIDIA/cuda-checkpoint#17; noticed at ${since}). Your cell runs once it does; ` +
        'to start over instead, restart the kernel (its variables are lost).',
      failed: true,
      resumable: false // a restore is under way: Resume would only wait for it
    };
  }
  const waiting = kernels.find(k => k.hibernation?.waiting_for_gpu);
  if (waiting) {
    const h = waiting.hibernation!;
    const since = h.waiting_since ? `, since ${formatClock(new Date(h.waiting_since), now)}` : '';
    if (h.gpu_state_at_risk) {
      return {
        short: 'GPU restore refused: its state may be lost',
        sentence:
          'The CUDA driver refused to restore this kernel\'s GPU state for want of room; on ' +
          'current drivers that can lose it (NVIDIA/cuda-checkpoint#44). One more restore is ' +
          'tried when there is room; if it fails, restart the kernel.',
        failed: true,
        resumable: true
      };
    }
    return {
      short: 'GPU full: waiting for room',
      sentence:
        'The GPU this notebook shares is full right now: the kernel waits while another ' +
        "notebook's idle kernel is swapped out to host memory, and your cell runs as soon as " +
        `there is room (${h.waiting_why ?? 'no room'}${since})` +
        '. Its GPU state stays in host memory meanwhile: it is never restored into a full ' +
        'GPU. Shutting down another of your own kernels makes room.',
      failed: false,
      resumable: true
    };
  }
  const failed = kernels.find(k => k.hibernation?.state === 'restore_failed');
  if (failed) {
    const h = failed.hibernation!;
    const retry = h.next_retry ? ` at ${formatClock(new Date(h.next_retry), now)}` : '';
    return {
      short: `GPU restore failed: retrying${retry}`,
      sentence:
        `The kernel's GPU state could not be restored yet (${h.restore_error ?? 'unknown'}); ` +
        `retrying${retry}. The kernel is kept, its GPU state in host memory; restart the ` +
        'kernel to start over.',
      failed: true,
      resumable: true
    };
  }
  // a copy under way (1.4-1.9 GiB/s to host memory, 3.4-5.5 GiB/s back on an H200: a minute
  // for 80 GiB): a cell run meanwhile waits for it, so the words say so, not "resumes"
  const resuming = kernels.filter(k => k.hibernation?.state === 'resuming');
  if (resuming.length) {
    const back = resuming.reduce(
      (sum, k) => sum + (k.hibernation?.hibernated_gpu_memory_mib ?? 0),
      0
    );
    const what = back > 0 ? formatMemory(back) : 'its state';
    return {
      short: `GPU resuming: bringing ${what} back from host memory`,
      sentence:
        `The kernel's GPU state${back > 0 ? ` (${formatMemory(back)})` : ''} is being ` +
        'copied back from host memory to the GPU; a cell you run waits until it is back, ' +
        `then runs${last}.`,
      failed: false,
      resumable: false // the copy back is what Resume would do
    };
  }
  const copying = kernels.filter(k => k.hibernation?.state === 'hibernating');
  if (copying.length) {
    // what moves is what the kernel's process holds on the GPU now (until the copy is done;
    // hibernated_gpu_memory_mib says what it copies, from its start)
    const moving = copying.reduce((sum, k) => sum + (k.gpu_memory_mib ?? 0), 0);
    return {
      short:
        moving > 0
          ? `GPU hibernating: moving ${formatMemory(moving)} to host memory`
          : 'GPU hibernating: moving its state to host memory',
      sentence:
        `The kernel's GPU state${moving > 0 ? ` (${formatMemory(moving)})` : ''} is being ` +
        'copied to host memory. A cell you run now waits until the copy is done; then ' +
        `the state comes back to the GPU and the cell runs${last}. Resume is offered once ` +
        'the copy is done.',
      failed: false,
      resumable: false // Resume would only wait for the copy
    };
  }
  const memory = kernels.reduce(
    (sum, k) => sum + (k.hibernation?.hibernated_gpu_memory_mib ?? 0),
    0
  );
  const swapped = kernels.find(k => k.hibernation?.hibernated_why?.startsWith('swapped out'));
  if (swapped) {
    // over-commit: the culler swapped it out to make room on a shared GPU
    return {
      short: `GPU swapped out: resumes when you run a cell${last}`,
      sentence:
        `${formatMemory(memory)} of GPU memory is parked in host memory: ` +
        `${swapped.hibernation!.hibernated_why}. It comes back when you run a cell or press ` +
        `Resume${last}.`,
      failed: false,
      resumable: true
    };
  }
  return {
    short: `GPU hibernated: resumes when you run a cell${last}`,
    sentence:
      `${formatMemory(memory)} of GPU memory is parked in host memory while the kernel is ` +
      `idle; it comes back when you run a cell or press Resume${last}.`,
    failed: false,
    resumable: true
  };
}

/** What the status bar item shows. */
export interface IMeterText {
  slice: string;
  memory: string;
  utilization: string;
  /** Spoken and shown in the tooltip: the same facts in a sentence. */
  summary: string;
  /** 'near' at 90 % of the limit, 'over' beyond it: said in words, not by colour alone. */
  memoryState: 'ok' | 'near' | 'over';
}

const MIB_PER_GIB = 1024;

/** How much less than the slice has left the shared device may have free before it is said. */
const SHARED_SLACK_MIB = 1024;

/** `20480` -> '20', `6144` -> '6.0', `9728` -> '9.5' (GiB, the limit without decimals). */
function gibNumber(mib: number, decimals: number): string {
  return (mib / MIB_PER_GIB).toFixed(decimals);
}

/** `9216` -> '9 GiB', `9728` -> '9.5 GiB', `512` -> '512 MiB'. */
export function formatMemory(mib: number): string {
  if (mib < MIB_PER_GIB) {
    return `${Math.round(mib)} MiB`;
  }
  const gib = mib / MIB_PER_GIB;
  const whole = Math.abs(gib - Math.round(gib)) < 0.05;
  return whole ? `${Math.round(gib)} GiB` : `${gib.toFixed(1)} GiB`;
}

/** `42` -> '42 s', `1500` -> '25 min', `6300` -> '1 h 45 min' (no-break spaces). */
export function formatDuration(seconds: number): string {
  const s = Math.max(0, Math.round(seconds));
  const nbsp = '\u00a0'; // '3 s' never breaks over two lines
  if (s < 60) {
    return `${s}${nbsp}s`;
  }
  const minutes = Math.floor(s / 60);
  if (minutes < 60) {
    return `${minutes}${nbsp}min`;
  }
  const hours = Math.floor(minutes / 60);
  const rest = minutes % 60;
  return rest ? `${hours}${nbsp}h ${rest}${nbsp}min` : `${hours}${nbsp}h`;
}

/** A time of day in the user's locale ('14:05', '2:05 PM'), with the date when not today. */
export function formatClock(when: Date, now: Date): string {
  const time = when.toLocaleTimeString(undefined, { hour: '2-digit', minute: '2-digit' });
  if (when.toDateString() === now.toDateString()) {
    return time;
  }
  return `${when.toLocaleDateString(undefined, { month: 'short', day: 'numeric' })} ${time}`;
}

/** The meter's text, or null when there is nothing to show (no GPU: no meter). */
export function meterText(report: IGpuReport): IMeterText | null {
  if (!report.available) {
    return null;
  }
  const devices = report.devices ?? [];
  const total = devices.reduce((sum, d) => sum + d.memory_total_mib, 0);
  const limit = report.slice?.memory_mib || total || null;
  const used = report.gpu_memory_mib ?? 0;
  const label = report.slice?.label || devices[0]?.name || 'GPU';
  // where the limit counts hibernated kernels (HAMi-core), they take the slice too: an
  // allocation beyond what is left fails although the GPU reads them as gone. A copy under
  // way is in the total and still in `used` (on the GPU until it is done): counted once
  const copying = (report.kernels ?? [])
    .filter(k => k.hibernation?.state === 'hibernating')
    .reduce((sum, k) => sum + (k.hibernation?.hibernated_gpu_memory_mib ?? 0), 0);
  const asleep = report.slice?.counts_hibernated
    ? Math.max(0, (report.hibernated_gpu_memory_mib ?? 0) - copying)
    : 0;
  const counted = used + asleep;
  const asleepText = asleep > 0 ? ` (+${gibNumber(asleep, 1)} hibernated)` : '';
  const asleepWords =
    asleep > 0
      ? `, and ${formatMemory(asleep)} of hibernated kernels that still count against the ` +
        'slice here (shut one down to free its share)'
      : '';

  let memory = `Mem ${gibNumber(used, 1)}${asleepText} GiB`;
  let memoryWords = `${formatMemory(used)} of GPU memory in use${asleepWords}`;
  let memoryState: IMeterText['memoryState'] = 'ok';
  if (limit) {
    memory = `Mem ${gibNumber(used, 1)}${asleepText} / ${formatMemory(limit)}`;
    memoryWords = `${formatMemory(used)} of ${formatMemory(limit)} GPU memory in use${asleepWords}`;
    if (counted > limit) {
      memoryState = 'over';
      memory += ' (over limit)';
    } else if (counted >= 0.9 * limit) {
      memoryState = 'near';
      memory += ' (near limit)';
    }
    // on a device shared with other pods their memory is not this slice's to take: where
    // the device has less free than the slice has left, a larger allocation fails anyway
    const free = report.device_free_mib;
    const left = Math.max(0, limit - counted);
    if (typeof free === 'number' && free + SHARED_SLACK_MIB <= left) {
      memory += ` (${formatMemory(free)} free on the GPU)`;
      const whose = report.device_free_by === 'culler' ? " by the culler's count" : '';
      memoryWords +=
        `; the GPU is shared, and its other users hold all but ${formatMemory(free)} of it ` +
        `now${whose}, less than the ${formatMemory(left)} left in your slice: a larger ` +
        'allocation fails with CUDA out of memory until they free some';
      if (memoryState === 'ok') {
        memoryState = 'near';
      }
    }
  }

  const util = report.gpu_utilization;
  const known = util !== null && util !== undefined;
  const utilization = known ? `Util ${Math.round(util)}%` : 'Util n/a';
  const utilWords = known
    ? `utilisation ${Math.round(util)}%`
    : 'utilisation cannot be read here (MIG instances do not report it)';
  const simulated = report.source === 'simulated' ? ' (simulated GPU readings)' : '';
  return {
    slice: `GPU ${label}`,
    memory,
    utilization,
    summary: `GPU slice ${label}: ${memoryWords}, ${utilWords}${simulated}.`,
    memoryState
  };
}

/** The short status bar text for the most urgent warning ('⚠ idle kernel ...'). */
export function warningShort(w: IGpuWarning, name: string | null, now: Date): string {
  const at = formatClock(new Date(w.cull_at), now);
  if (w.scope === 'server') {
    return w.reason === 'max_age'
      ? `Server stops at ${at} (maximum age)`
      : `Idle server stops at ${at}`;
  }
  return `Idle kernel${name ? ` (${name})` : ''} shut down at ${at}`;
}

/**
 * The warning in a sentence, e.g. "train.ipynb: this kernel holds 9 GiB of GPU memory and has
 * been GPU-idle 25 min; it will be shut down at 14:05 unless used." (at most 140 characters:
 * JupyterLab cuts notifications there).
 */
export function warningSentence(w: IGpuWarning, name: string | null, now: Date): string {
  const cullAt = new Date(w.cull_at);
  const when =
    cullAt.getTime() <= now.getTime() ? 'any moment now' : `at ${formatClock(cullAt, now)}`;
  const idle = formatDuration(w.idle_seconds);
  const memory = formatMemory(w.gpu_memory_mib);
  if (w.scope === 'server' && w.reason === 'max_age') {
    // using it does not help: the server is stopped at its age limit, busy or not
    return (
      `This server reaches its maximum age (${formatDuration(w.limit_seconds)}); ` +
      `it will be stopped ${when}, in use or not. Your files stay.`
    );
  }
  if (w.scope === 'server' && w.reason === 'unattended') {
    return (
      `Nobody has used this server for ${idle}; it will be stopped ${when} unless used, ` +
      'even while its GPU works. Your files stay.'
    );
  }
  if (w.scope === 'server') {
    const holds = w.gpu_memory_mib > 0 ? `holds ${memory} of GPU memory and ` : '';
    return (
      `This server ${holds}has been idle ${idle}; ` +
      `it will be stopped ${when} unless used. Your files stay.`
    );
  }
  const who = name ? `${name}: this kernel` : 'A kernel';
  return (
    `${who} holds ${memory} of GPU memory and has been GPU-idle ${idle}; ` +
    `it will be shut down ${when} unless used.`
  );
}

/** A stable key per coming cull: a new deadline is a new warning. */
export function warningKey(w: IGpuWarning): string {
  return `${w.scope}:${w.kernel_id ?? ''}:${w.cull_at}`;
}
