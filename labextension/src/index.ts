/**
 * fracspawner's GPU meter: the server's GPU slice, memory and utilisation in JupyterLab's status
 * bar, and a warning before the culler shuts down an idle kernel or stops the server.
 *
 * It reads `GET /api/fracspawner/gpu` from fracspawner's server extension, and only where that
 * extension says it is there (page config `fracspawnerGpuUrl`). No GPU, no extension, a request
 * that fails: no meter, and nothing in the console. It also tells the server whether a person
 * is at this tab (presence.ts), where the extension asks for it (`fracspawnerPresence`).
 */

import {
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { Notification } from '@jupyterlab/apputils';
import { PageConfig, URLExt } from '@jupyterlab/coreutils';
import { ServerConnection, ServiceManager } from '@jupyterlab/services';
import { IStatusBar } from '@jupyterlab/statusbar';
import { Poll } from '@lumino/polling';
import { Signal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import {
  hibernationText,
  IGpuReport,
  IGpuWarning,
  meterText,
  warningKey,
  warningSentence,
  warningShort
} from './format';
import { startPresence } from './presence';

const PLUGIN_ID = 'fracspawner-gpu-meter:plugin';
const PAGE_CONFIG_KEY = 'fracspawnerGpuUrl';
const PRESENCE_CONFIG_KEY = 'fracspawnerPresence';
/** Seconds between two reports: the server's own poll interval, within these bounds. */
const MIN_INTERVAL = 1;
const MAX_INTERVAL = 10;
/** Without a GPU, look again this rarely (a driver may come back; it rarely does). */
const IDLE_INTERVAL = 60;
const NAME_MAX = 20; // notifications are cut at 140 characters: the sentence needs ~120

/** The status bar item: three short texts, a warning, and a polite live region. */
class GpuMeter extends Widget {
  readonly activeStateChanged = new Signal<this, void>(this);
  private _active = false;
  private readonly _slice: HTMLSpanElement;
  private readonly _memory: HTMLSpanElement;
  private readonly _util: HTMLSpanElement;
  private readonly _warning: HTMLSpanElement;
  private readonly _hibernation: HTMLSpanElement;
  private readonly _resume: HTMLButtonElement;
  /** Called when the user presses Resume (the plugin posts to the extension). */
  onResume: (() => Promise<void>) | null = null;

  constructor() {
    super();
    this.id = 'fracspawner-gpu-meter';
    this.addClass('fs-GpuMeter');
    const part = (cls: string): HTMLSpanElement => {
      const span = document.createElement('span');
      span.className = cls;
      this.node.appendChild(span);
      return span;
    };
    this._slice = part('fs-GpuMeter-slice');
    this._memory = part('fs-GpuMeter-memory');
    this._util = part('fs-GpuMeter-util');
    this._warning = part('fs-GpuMeter-warning');
    // announced once when a warning appears or changes, never on every reading
    this._warning.setAttribute('aria-live', 'polite');
    this._warning.hidden = true;
    this._hibernation = part('fs-GpuMeter-hibernation');
    this._hibernation.setAttribute('aria-live', 'polite');
    this._hibernation.hidden = true;
    this._resume = document.createElement('button');
    this._resume.className = 'fs-GpuMeter-resume jp-mod-styled';
    this._resume.type = 'button';
    this._resume.textContent = 'Resume';
    this._resume.title = 'Bring the hibernated kernel back to the GPU now';
    this._resume.hidden = true;
    this._resume.addEventListener('click', event => {
      event.stopPropagation();
      if (this.onResume) {
        this._resume.disabled = true;
        this._resume.textContent = 'Resuming…';
        void this.onResume().finally(() => {
          this._resume.disabled = false;
          this._resume.textContent = 'Resume';
        });
      }
    });
    this.node.appendChild(this._resume);
  }

  setHibernation(short: string | null, sentence: string, showResume: boolean): void {
    if ((short ?? '') !== (this._hibernation.textContent ?? '')) {
      this._hibernation.textContent = short ?? '';
    }
    this._hibernation.hidden = !short;
    this._hibernation.title = sentence;
    this._resume.hidden = !showResume;
  }

  get active(): boolean {
    return this._active;
  }

  setReport(report: IGpuReport, warning: string | null, warningTitle: string): void {
    const text = meterText(report);
    const active = text !== null;
    if (text) {
      this._slice.textContent = text.slice;
      this._memory.textContent = text.memory;
      this._memory.dataset.state = text.memoryState;
      this._util.textContent = text.utilization;
      this.node.title = warningTitle ? `${text.summary}\n${warningTitle}` : text.summary;
    }
    if ((warning ?? '') !== (this._warning.textContent ?? '')) {
      this._warning.textContent = warning ?? '';
    }
    this._warning.hidden = !warning;
    if (active !== this._active) {
      this._active = active;
      this.activeStateChanged.emit();
    }
  }

  deactivate(): void {
    if (this._active) {
      this._active = false;
      this.activeStateChanged.emit();
    }
  }
}

/** Keeps one notification per coming cull; dismisses it once the kernel or server is used. */
class Warnings {
  private _shown = new Map<string, string>(); // warning key -> notification id

  constructor(private readonly _services: ServiceManager.IManager) {}

  /** The name the user knows a kernel by: its notebook or console, else null. */
  nameOf(kernelId: string | undefined): string | null {
    if (!kernelId) {
      return null;
    }
    for (const session of this._services.sessions.running()) {
      if (session.kernel?.id === kernelId) {
        const name = session.path.split('/').pop() || session.name;
        return name.length > NAME_MAX ? `${name.slice(0, NAME_MAX - 1)}…` : name;
      }
    }
    return null;
  }

  update(warnings: IGpuWarning[], now: Date): void {
    const current = new Set<string>();
    for (const w of warnings) {
      const key = warningKey(w);
      current.add(key);
      if (this._shown.has(key)) {
        continue;
      }
      const actions: Notification.IAction[] = [];
      if (w.scope === 'kernel' && w.kernel_id) {
        const id = w.kernel_id;
        actions.push({
          label: 'Shut down now',
          caption: 'Shut this kernel down now and give its GPU memory back',
          callback: () => {
            void this._services.kernels.shutdown(id).catch(() => undefined);
          }
        });
      }
      const message = warningSentence(w, this.nameOf(w.kernel_id), now);
      this._shown.set(key, Notification.warning(message, { autoClose: false, actions }));
    }
    for (const [key, id] of this._shown) {
      if (!current.has(key)) {
        Notification.dismiss(id);
        this._shown.delete(key);
      }
    }
  }
}

function mostUrgent(warnings: IGpuWarning[]): IGpuWarning | null {
  return warnings.reduce<IGpuWarning | null>(
    (first, w) => (first === null || w.cull_at < first.cull_at ? w : first),
    null
  );
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'The GPU slice, its memory and utilisation, and idle-culling warnings',
  autoStart: true,
  optional: [IStatusBar],
  activate: (app: JupyterFrontEnd, statusBar: IStatusBar | null) => {
    // the person's presence (presence.ts), with or without a status bar to show the meter in
    startPresence(
      PageConfig.getOption(PRESENCE_CONFIG_KEY),
      app.serviceManager.serverSettings
    );
    const path = PageConfig.getOption(PAGE_CONFIG_KEY);
    if (!statusBar || !path) {
      return; // no status bar, or no fracspawner server extension: nothing to show
    }
    const settings = app.serviceManager.serverSettings;
    const url = URLExt.join(settings.baseUrl, path);
    const meter = new GpuMeter();
    meter.onResume = async () => {
      try {
        await ServerConnection.makeRequest(
          URLExt.join(url, 'resume'),
          { method: 'POST', body: JSON.stringify({}) },
          settings
        );
      } catch {
        // the next reading says how it went
      }
      void poll.refresh();
    };
    const warnings = new Warnings(app.serviceManager);
    statusBar.registerStatusItem(PLUGIN_ID, {
      item: meter,
      align: 'left',
      rank: 50,
      isActive: () => meter.active,
      activeStateChanged: meter.activeStateChanged
    });

    const poll = new Poll({
      auto: false,
      factory: async () => {
        let response: Response;
        try {
          response = await ServerConnection.makeRequest(url, { method: 'GET' }, settings);
        } catch {
          meter.deactivate();
          throw new Error('unreachable'); // the poll backs off; nothing is logged
        }
        if (!response.ok) {
          meter.deactivate();
          if (response.status === 403 || response.status === 404) {
            poll.dispose(); // not allowed or not there: stop asking
            return;
          }
          throw new Error(`HTTP ${response.status}`);
        }
        const report = (await response.json()) as IGpuReport;
        const now = new Date();
        const list = report.available ? report.warnings ?? [] : [];
        const first = mostUrgent(list);
        const name = (w: IGpuWarning) => warnings.nameOf(w.kernel_id);
        const short = first ? `⚠ ${warningShort(first, name(first), now)}` : null;
        const title = list.map(w => warningSentence(w, name(w), now)).join('\n');
        meter.setReport(report, short, title);
        const hibernation = report.available ? hibernationText(report, now) : null;
        meter.setHibernation(
          hibernation?.short ?? null,
          hibernation?.sentence ?? '',
          hibernation?.resumable ?? false // not while a copy is under way (format.ts)
        );
        warnings.update(list, now);
        const seconds = report.available
          ? Math.min(MAX_INTERVAL, Math.max(MIN_INTERVAL, report.poll_interval ?? 5))
          : IDLE_INTERVAL;
        if (poll.frequency.interval !== seconds * 1000) {
          poll.frequency = { ...poll.frequency, interval: seconds * 1000 };
        }
      },
      frequency: { interval: 5000, backoff: true, max: 5 * 60 * 1000 },
      name: PLUGIN_ID,
      standby: 'when-hidden'
    });
    void app.restored.then(() => poll.start());
  }
};

export default plugin;
