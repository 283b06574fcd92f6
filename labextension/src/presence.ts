/**
 * Presence from the person, not the poller: this tab tells fracspawner's server extension
 * whether it is visible, whether it has the focus, and how long ago its user last pressed a
 * key, moved or clicked the mouse, turned its wheel, or touched the screen. The server decides with its own
 * timeout (fracspawner/serverext/presence.py); JupyterLab's own polling of the REST API
 * (every 10 s while the tab is visible) then no longer keeps idle GPU kernels alive, and a
 * person reading without a request does not lose theirs.
 *
 * The tab reports every `interval` seconds (the server's setting; browsers slow timers of
 * hidden tabs to about once a minute, which is enough), at once when it is shown or hidden,
 * and at once when it is used again after a pause (so a person coming back counts before
 * the next report). The report is not activity by itself.
 */

import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

/**
 * Input events a person makes (capture phase: every target, never blocked), counted only when
 * the browser made them from the person's input (`isTrusted`): a page script's dispatchEvent()
 * is nobody. No `scroll`: the browser fires it, trusted, for a script's scrolling too
 * (JupyterLab scrolls its own panels and outputs), 12 times in 6 s with nobody there (issue
 * 38 #6); a person's scrolling comes with a wheel, key, touch or pointer event, counted here.
 */
const INPUT_EVENTS = ['keydown', 'pointerdown', 'pointermove', 'wheel', 'touchstart'];
/** A pause this long (ms) in input makes the next input report at once. */
const PAUSE_MS = 30 * 1000;
/** Never more than one report in this long (ms), whatever happens. */
const MIN_GAP_MS = 2 * 1000;

export interface IPresenceConfig {
  url: string;
  interval: number; // seconds
}

/** The page config's `fracspawnerPresence` (JSON text), or null where it is absent or wrong. */
export function parsePresenceConfig(text: string): IPresenceConfig | null {
  if (!text) {
    return null;
  }
  try {
    const value = JSON.parse(text) as Partial<IPresenceConfig>;
    if (typeof value.url !== 'string' || typeof value.interval !== 'number') {
      return null;
    }
    return { url: value.url, interval: Math.max(1, value.interval) };
  } catch {
    return null;
  }
}

/** A random id for this tab: the server keeps one report per tab. */
function tabId(): string {
  const bytes = new Uint8Array(12);
  crypto.getRandomValues(bytes);
  return Array.from(bytes, b => b.toString(16).padStart(2, '0')).join('');
}

export class PresenceReporter {
  private readonly _client = tabId();
  private _lastInput = Date.now(); // opening the page is the person's act
  private _lastSent = 0;
  private _lastSentIdleMs = 0;
  private _timer: number | null = null;
  private _pending: number | null = null;
  private _stopped = false;

  constructor(
    private readonly _url: string,
    private _interval: number,
    private readonly _settings: ServerConnection.ISettings
  ) {}

  start(): void {
    for (const name of INPUT_EVENTS) {
      window.addEventListener(name, this._onInput, { capture: true, passive: true });
    }
    window.addEventListener('focus', this._onWindowFocus);
    window.addEventListener('blur', this._onChange, { capture: true });
    document.addEventListener('visibilitychange', this._onVisibility);
    window.addEventListener('pagehide', this._onPageHide);
    void this._send();
  }

  stop(): void {
    this._stopped = true;
    for (const name of INPUT_EVENTS) {
      window.removeEventListener(name, this._onInput, { capture: true });
    }
    window.removeEventListener('focus', this._onWindowFocus);
    window.removeEventListener('blur', this._onChange, { capture: true });
    document.removeEventListener('visibilitychange', this._onVisibility);
    window.removeEventListener('pagehide', this._onPageHide);
    this._clear();
  }

  private _clear(): void {
    if (this._timer !== null) {
      window.clearTimeout(this._timer);
      this._timer = null;
    }
    if (this._pending !== null) {
      window.clearTimeout(this._pending);
      this._pending = null;
    }
  }

  private readonly _onInput = (event: Event): void => {
    if (!event.isTrusted) {
      return; // made by a script, not by the person
    }
    const now = Date.now();
    const paused = now - this._lastInput >= PAUSE_MS;
    this._lastInput = now;
    // back after a pause, or the server was last told of a long pause: say so now
    if (paused || this._lastSentIdleMs >= PAUSE_MS) {
      this._soon();
    }
  };

  /** The window itself gaining the focus (the person switched to it); not an element's focus,
   * which JupyterLab's own code moves about (a cell's editor after a run, a dialog). */
  private readonly _onWindowFocus = (event: Event): void => {
    if (event.target === window) {
      this._onInput(event);
    }
  };

  private readonly _onVisibility = (): void => {
    if (document.visibilityState === 'visible') {
      this._lastInput = Date.now(); // showing the tab is the person's act
      this._soon();
    } else {
      this._onLeave(); // hidden: possibly closing, when no timer runs any more
    }
  };

  /** Hidden or closing: say so now, in this event (a timer would not run during unload; the
   * request is started here and `keepalive` lets it outlive the page). */
  private readonly _onLeave = (): void => {
    if (this._pending !== null) {
      window.clearTimeout(this._pending);
      this._pending = null;
    }
    void this._send();
  };

  /** The page goes away (closed, reloaded, navigated from): the server forgets this tab at
   * once, so a reloaded page's old tab does not count as a hidden one until it goes stale. */
  private readonly _onPageHide = (event: PageTransitionEvent): void => {
    if (this._pending !== null) {
      window.clearTimeout(this._pending);
      this._pending = null;
    }
    void this._send(!event.persisted);
  };

  private readonly _onChange = (): void => {
    this._soon();
  };

  /** Report now, or as soon as MIN_GAP_MS allows. */
  private _soon(): void {
    if (this._stopped || this._pending !== null) {
      return;
    }
    const wait = Math.max(0, this._lastSent + MIN_GAP_MS - Date.now());
    this._pending = window.setTimeout(() => {
      this._pending = null;
      void this._send();
    }, wait);
  }

  private async _send(closing = false): Promise<void> {
    if (this._stopped) {
      return;
    }
    if (this._timer !== null) {
      window.clearTimeout(this._timer);
      this._timer = null;
    }
    const now = Date.now();
    const idleMs = Math.max(0, now - this._lastInput);
    this._lastSent = now;
    this._lastSentIdleMs = idleMs;
    const body = {
      client: this._client,
      visible: document.visibilityState === 'visible',
      focused: document.hasFocus(),
      idle_seconds: idleMs / 1000,
      ...(closing ? { closing: true } : {})
    };
    try {
      const response = await ServerConnection.makeRequest(
        this._url,
        { method: 'POST', body: JSON.stringify(body), keepalive: true },
        this._settings
      );
      if (response.status === 403 || response.status === 404) {
        this.stop(); // not allowed, or an older server extension: stop asking
        return;
      }
      if (response.ok) {
        const answer = (await response.json()) as { interval?: number };
        if (typeof answer.interval === 'number' && answer.interval >= 1) {
          this._interval = answer.interval;
        }
      }
    } catch {
      // unreachable now: the next report tries again
    }
    if (!this._stopped && this._timer === null) {
      this._timer = window.setTimeout(() => void this._send(), this._interval * 1000);
    }
  }
}

/** Start reporting where the server extension asks for it (page config). */
export function startPresence(
  configText: string,
  settings: ServerConnection.ISettings
): PresenceReporter | null {
  const config = parsePresenceConfig(configText);
  if (!config) {
    return null;
  }
  const reporter = new PresenceReporter(
    URLExt.join(settings.baseUrl, config.url),
    config.interval,
    settings
  );
  reporter.start();
  return reporter;
}
