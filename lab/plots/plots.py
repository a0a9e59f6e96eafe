"""Plots of quicsdn-lab's benches, in the style of the quicSDN papers' figures.

    python plots.py overhead|delay|table1|model|hol|migration|reconnect|storm|bicast|sdudp DIR

Reads DIR/<kind>.csv (sdudp: DIR/cells.csv; written by `quicsdn-lab bench <kind>` or `quicsdn-lab model`),
writes PNGs into DIR and prints their paths, one per line. Only reads and draws:
every number comes from the CSV.
"""

import csv
import os
import sys
from collections import OrderedDict, defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {
    "tcp": "#d62728",
    "tls": "#ff7f0e",
    "quic": "#1f77b4",
    "quic-rr16": "#17becf",
    "quic-tuned": "#2ca02c",
    "kcptun": "#9467bd",
    "quic ordered": "#9edae5",
    "quic (default: safe)": "#1f77b4",
}
MIB = 1024.0 * 1024.0


def rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def order(values):
    return list(OrderedDict.fromkeys(values))


def save(fig, d, name):
    p = os.path.join(d, name)
    fig.tight_layout()
    fig.savefig(p, dpi=110)
    plt.close(fig)
    print(p)


def overhead(d):
    data = rows(os.path.join(d, "overhead.csv"))
    transports = order(r["transport"] for r in data)
    tot = defaultdict(float)
    for r in data:
        tot[(r["rtt"], r["loss_pct"], r["rate"], r["transport"])] += float(r["overhead_bytes"])
    for rtt in order(r["rtt"] for r in data):
        losses = order(r["loss_pct"] for r in data if r["rtt"] == rtt)
        fig, axes = plt.subplots(1, len(losses), figsize=(5.5 * len(losses), 4), squeeze=False)
        for ax, loss in zip(axes[0], losses):
            rates = order(r["rate"] for r in data if r["rtt"] == rtt and r["loss_pct"] == loss)
            w = 0.8 / len(transports)
            for i, t in enumerate(transports):
                ys = [tot[(rtt, loss, rate, t)] / MIB for rate in rates]
                xs = [j + (i - (len(transports) - 1) / 2) * w for j in range(len(rates))]
                ax.bar(xs, ys, w, label=t, color=COLORS.get(t))
            ax.set_xticks(range(len(rates)))
            ax.set_xticklabels([f"{float(x):g}" for x in rates])
            ax.set_xlabel("messages per second (each direction)")
            ax.set_ylabel("protocol overhead (MiB, both directions)")
            ax.set_title(f"{rtt} RTT, {loss}% loss")
            ax.legend(fontsize=8)
        save(fig, d, f"overhead-{rtt}.png")


def delay(d):
    data = rows(os.path.join(d, "delay.csv"))
    transports = order(r["transport"] for r in data)
    groups = defaultdict(list)
    for r in data:
        groups[(r["sizes"], r["rtt_ms"], r["loss_pct"], r["transport"])].append(float(r["delay_ms"]))
    panels = order((r["sizes"], r["rtt_ms"]) for r in data)
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2), squeeze=False)
    for ax, (sizes, rtt) in zip(axes[0], panels):
        losses = order(r["loss_pct"] for r in data if r["sizes"] == sizes and r["rtt_ms"] == rtt)
        w = 0.8 / len(transports)
        for i, t in enumerate(transports):
            pos = [j + (i - (len(transports) - 1) / 2) * w for j in range(len(losses))]
            vals = [groups[(sizes, rtt, loss, t)] for loss in losses]
            bp = ax.boxplot(vals, positions=pos, widths=w * 0.9, patch_artist=True, showfliers=False)
            for b in bp["boxes"]:
                b.set_facecolor(COLORS.get(t, "grey"))
            ax.plot([], [], color=COLORS.get(t, "grey"), lw=6, label=t)
        ax.set_xticks(range(len(losses)))
        ax.set_xticklabels([f"{x}%" for x in losses])
        ax.set_xlabel("loss")
        ax.set_ylabel("delivery delay (ms)")
        ax.set_title(f"<{sizes.replace('/', ', ')}>, RTT {rtt} ms")
        ax.legend(fontsize=7)
    save(fig, d, "delay.png")


def table1(d):
    data = rows(os.path.join(d, "table1.csv"))
    transports = order(r["transport"] for r in data)
    exps = order(r["experiment"] for r in data)
    fig, axes = plt.subplots(1, len(exps), figsize=(5.5 * len(exps), 4), squeeze=False)
    for ax, e in zip(axes[0], exps):
        levels = order(r["level"] for r in data if r["experiment"] == e)
        w = 0.8 / len(transports)
        for i, t in enumerate(transports):
            ys = []
            for lv in levels:
                v = [float(r["bytes_per_s"]) for r in data if r["experiment"] == e and r["level"] == lv and r["transport"] == t]
                ys.append(v[0] if v else 0.0)
            xs = [j + (i - (len(transports) - 1) / 2) * w for j in range(len(levels))]
            ax.bar(xs, ys, w, label=t, color=COLORS.get(t))
        ax.set_yscale("log")
        ax.set_xticks(range(len(levels)))
        ax.set_xticklabels(levels)
        ax.set_ylabel("bytes/s on the control link")
        ax.set_title(e)
        ax.legend(fontsize=7)
    save(fig, d, "table1.png")


def model(d):
    data = rows(os.path.join(d, "fig2.csv"))
    cols = order((r["rate"], r["agents"]) for r in data)
    fig, axes = plt.subplots(2, len(cols), figsize=(3.6 * len(cols), 6), squeeze=False)
    for j, (rate, agents) in enumerate(cols):
        sub = [r for r in data if r["rate"] == rate and r["agents"] == agents]
        for proto, color in (("tcp", COLORS["tcp"]), ("quic", COLORS["quic"])):
            s = [r for r in sub if r["protocol"] == proto]
            xs = [float(r["t_b_ms"]) for r in s]
            axes[0][j].plot(xs, [float(r["transmission_bytes"]) / 1024 for r in s], color=color, label=proto)
            axes[1][j].plot(xs, [float(r["ack_bytes"]) / 1024 for r in s], color=color, label=proto)
        axes[0][j].set_title(f"λ={rate}/s, |A|={agents}")
        axes[1][j].set_xlabel("buffering delay T_b (ms)")
        for i in range(2):
            axes[i][j].legend(fontsize=7)
    axes[0][0].set_ylabel("transmission overhead (KiB)")
    axes[1][0].set_ylabel("ACK overhead (KiB)")
    save(fig, d, "fig2.png")
    vpath = os.path.join(d, "validation.csv")
    if os.path.exists(vpath):
        v = rows(vpath)
        fig, ax = plt.subplots(figsize=(6, 4))
        labels = [f"{r['transport']}\n{r['case']}" for r in v]
        xs = range(len(v))
        ax.bar([x - 0.2 for x in xs], [float(r["measured_overhead"]) / 1024 for r in v], 0.4, label="measured")
        ax.bar([x + 0.2 for x in xs], [float(r["predicted_overhead"]) / 1024 for r in v], 0.4, label="model")
        ax.set_xticks(list(xs))
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_ylabel("transport overhead (KiB)")
        ax.set_title("file transfer: model vs measurement (preprint Fig. 4)")
        ax.legend()
        save(fig, d, "validation.png")


def hol(d):
    data = rows(os.path.join(d, "hol.csv"))
    transports = order(r["transport"] for r in data)
    groups = defaultdict(list)
    for r in data:
        groups[(r["bench"], r["loss_percent"], r["transport"])].append(float(r["sample_ms"]))
    panels = order((r["bench"], r["loss_percent"]) for r in data)
    # The propagation delay in each sample (see hol.rs): a 20 ms round trip for
    # echo, 50 ms one way for packet-ins.
    floor = {"echo": 20.0, "packet-in": 50.0}
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4.2), squeeze=False)
    for ax, (bench, loss) in zip(axes[0], panels):
        vals = [groups[(bench, loss, t)] for t in transports]
        bp = ax.boxplot(vals, whis=(1, 99), patch_artist=True, showfliers=False, showmeans=True)
        for b, t in zip(bp["boxes"], transports):
            b.set_facecolor(COLORS.get(t, "grey"))
        if bench in floor:
            ax.axhline(floor[bench], color="black", ls="--", lw=0.8)
        ax.set_xticks(range(1, len(transports) + 1))
        ax.set_xticklabels([t.replace(" (", "\n(") for t in transports], fontsize=8)
        ax.set_ylabel("delay (ms)" if bench == "packet-in" else "echo round trip (ms)")
        ax.set_title(f"{bench}, {loss}% loss")
    save(fig, d, "hol.png")


def migration(d):
    data = rows(os.path.join(d, "timeline.csv"))
    transports = order(r["transport"] for r in data)
    fig, axes = plt.subplots(4, 1, figsize=(10, 10), sharex=True)
    for i, t in enumerate(transports):
        sub = [r for r in data if r["transport"] == t]
        color = COLORS.get(t)
        data_bins = [r for r in sub if r["series"] == "data_bytes"]
        axes[0].plot([float(r["t_s"]) for r in data_bins],
                     [float(r["value"]) * 8 / 0.1 / 1e6 for r in data_bins], color=color, label=t, lw=1)
        ctl = [r for r in sub if r["series"] == "control_bytes"]
        axes[1].plot([float(r["t_s"]) for r in ctl], [float(r["value"]) for r in ctl], color=color, label=t, lw=1)
        replies = [r for r in sub if r["series"] == "stats_reply"]
        axes[2].plot([float(r["t_s"]) for r in replies], [float(r["value"]) / MIB for r in replies],
                     "o-", color=color, label=t, ms=3, lw=1)
        y = len(transports) - i
        axes[3].plot([float(r["t_s"]) for r in replies], [y] * len(replies), "|", color=color, ms=12,
                     label=f"{t}: stats reply")
        ovs_conn = [float(r["t_s"]) for r in sub if r["series"] == "ovs" and r["detail"].endswith(": connected")]
        axes[3].plot(ovs_conn, [y + 0.25] * len(ovs_conn), "x", color=color, ms=9,
                     label=f"{t}: OVS connected")
        new_conn = [float(r["t_s"]) for r in sub if r["series"] == "controller"]
        axes[3].plot(new_conn, [y - 0.25] * len(new_conn), "^", color=color, ms=7,
                     label=f"{t}: controller connection event")
        link = [r for r in sub if r["series"] == "link"]
        down = [float(r["t_s"]) for r in link if r["detail"] == "down"]
        up = [float(r["t_s"]) for r in link if r["detail"] == "up"]
        for a, b in zip(down, up):
            for ax in axes:
                ax.axvspan(a, b, color=color, alpha=0.12)
    axes[0].set_ylabel("host 1 → host 2\n(Mbit/s per 100 ms)")
    axes[1].set_ylabel("control link\n(bytes per 100 ms)")
    axes[2].set_ylabel("flow byte count in\nstats replies (MiB)")
    axes[3].set_yticks(range(1, len(transports) + 1))
    axes[3].set_yticklabels(list(reversed(transports)))
    axes[3].set_ylim(0.4, len(transports) + 0.6)
    # The event logged with the cut (the bench's --change), e.g. "switch re-addressed to …".
    change = next((r["detail"] for r in data if r["series"] == "link" and r["detail"] not in ("down", "up")), "")
    axes[3].set_xlabel(f"seconds from the start of polling (shaded: control link down; {change})")
    for ax in axes[:3]:
        ax.legend(fontsize=7, loc="upper left")
    axes[3].legend(fontsize=6, loc="upper left", ncol=3)
    axes[0].set_title("connection migration during a transfer (preprint Fig. 6)")
    save(fig, d, "migration.png")


def reconnect(d):
    data = rows(os.path.join(d, "reconnect.csv"))
    transports = order(r["transport"] for r in data)
    cols = [("first_message_rtts", "first message\nat the controller"),
            ("features_reply_rtts", "FEATURES_REPLY\nat the controller"),
            ("flow_mod_at_switch_rtts", "FLOW_MOD\nat the switch")]
    colors = {"quic": COLORS["quic"], "quic-no-0rtt": "#17becf", "tcp": COLORS["tcp"], "tls": COLORS["tls"]}
    switches = order(r["switch"] for r in data)
    fig, axes = plt.subplots(1, len(switches), figsize=(7 * len(switches), 4.5), squeeze=False)
    w = 0.8 / max(1, len(transports))
    rtt = data[0]["rtt_ms"] if data else "?"
    for ax, sw in zip(axes[0], switches):
        for i, t in enumerate(transports):
            vals = []
            for c, _ in cols:
                vals.append([float(r[c]) for r in data
                             if r["transport"] == t and r["switch"] == sw and r[c] != "-"])
            if not any(vals):
                continue
            pos = [j + (i - (len(transports) - 1) / 2) * w for j in range(len(cols))]
            bp = ax.boxplot(vals, positions=pos, widths=w * 0.85, patch_artist=True, showfliers=False)
            for b in bp["boxes"]:
                b.set_facecolor(colors.get(t, "grey"))
            # Every repetition, so narrow distributions stay visible.
            for p, v in zip(pos, vals):
                xs = [p + (k % 5 - 2) * w * 0.12 for k in range(len(v))]
                ax.scatter(xs, v, s=12, color=colors.get(t, "grey"), edgecolor="black", lw=0.4, zorder=3)
            ax.plot([], [], color=colors.get(t, "grey"), lw=6, label=t)
        ax.set_xticks(range(len(cols)))
        ax.set_xticklabels([c[1] for c in cols])
        ax.set_ylabel("time from the switch's new connection (RTTs)")
        ax.set_title(f"reconnect, switch: {sw}, RTT {rtt} ms")
        top = max([float(r[c]) for r in data if r["switch"] == sw for c, _ in cols if r[c] != "-"] or [1])
        if top > 15:
            ax.set_yscale("log")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    save(fig, d, "reconnect.png")


STORM_TARGETS_S = (10, 15)


def storm(d):
    per_switch = rows(os.path.join(d, "switches.csv"))
    restarts = rows(os.path.join(d, "restarts.csv"))
    configs = order(r["config"] for r in restarts)
    cmap = plt.get_cmap("tab10")
    color = {c: cmap(i % 10) for i, c in enumerate(configs)}
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [3, 2]})
    for c in configs:
        for k in order(r["restart"] for r in restarts if r["config"] == c):
            sel = [r for r in per_switch if r["config"] == c and r["restart"] == k]
            times = sorted(float(r["back_s"]) for r in sel if r["back_s"])
            if not times:
                continue
            n = len(sel)
            xs = [0.0] + [t for t in times for _ in (0, 1)]
            ys = [0.0] + [v for i in range(len(times)) for v in (i / n, (i + 1) / n)]
            label = c if k == "1" else None
            ax.plot(xs, [100 * y for y in ys], color=color[c], label=label, lw=1.4)
    # Targets: all back within 10 s (issue 6), within 15 s at 10,000 switches (issue 18).
    for t in STORM_TARGETS_S:
        ax.axvline(t, color="grey", ls=":", lw=1)
    ax.set_xlabel("seconds since the controller agent was stopped")
    ax.set_ylabel("switches back (% of all)")
    ax.set_title("reconnect storm: OpenFlow handshakes completed again")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)
    for i, c in enumerate(configs):
        vals = [r["all_back_s"] for r in restarts if r["config"] == c]
        for j, v in enumerate(vals):
            x = i + (j - (len(vals) - 1) / 2) * 0.25
            if v:
                bx.bar(x, float(v), 0.22, color=color[c])
            else:
                bx.text(x, 0.5, "not all", rotation=90, ha="center", va="bottom", fontsize=7)
    for t in STORM_TARGETS_S:
        bx.axhline(t, color="grey", ls=":", lw=1)
    bx.set_xticks(range(len(configs)))
    bx.set_xticklabels(configs, rotation=30, ha="right", fontsize=8)
    bx.set_ylabel("every switch back (s), each restart")
    bx.set_title("time until all are back (targets 10 s; 15 s at 10,000)", fontsize=10)
    save(fig, d, "storm.png")


def bicast(d):
    """The bicast paper's Fig. 8: download time against the loss rate of the
    client-side paths, one line per variant and mode (median of the
    downloads; a timed-out cell is drawn at the timeout with an open marker)."""
    data = rows(os.path.join(d, "bicast.csv"))
    fig, ax = plt.subplots(figsize=(7, 4.2))
    colors = {"tcp-cubic": "#d62728", "tcp-bbr": "#ff7f0e", "quic-bbr": "#1f77b4",
              "quic-cubic": "#2ca02c", "quic-bbr-lt": "#9467bd"}
    for v in order(r["variant"] for r in data):
        for m in order(r["mode"] for r in data):
            pts, outs = [], []
            for loss in sorted({float(r["loss_pct"]) for r in data}):
                cell = [r for r in data if r["variant"] == v and r["mode"] == m
                        and float(r["loss_pct"]) == loss]
                ok = sorted(float(r["seconds"]) for r in cell if r["status"] == "ok")
                if ok and not any(r["status"] == "timeout" for r in cell):
                    pts.append((loss, ok[len(ok) // 2]))
                elif any(r["status"] == "timeout" for r in cell):
                    outs.append((loss, max(float(r["seconds"]) for r in cell
                                           if r["status"] == "timeout")))
            if not pts and not outs:
                continue
            style = "-" if m == "bicast" else "--"
            label = "%s %s" % (v, m)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o",
                        color=colors.get(v), label=label, ms=4)
            if outs:
                ax.plot([p[0] for p in outs], [p[1] for p in outs], linestyle="none",
                        marker="^", mfc="none", color=colors.get(v), ms=6,
                        label=None if pts else label + " (timeout)")
    ax.set_xlabel("packet loss rate of the client-side paths (%)")
    ax.set_ylabel("download time (s)")
    ax.set_yscale("log")
    ax.set_title("download time vs loss: unicast and bicast (cf. Fig. 8)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    save(fig, d, "bicast.png")


def load_lines(load, pick):
    """Figs. 7-8 as the paper draws them, for a grid of many cells: frames
    (top) and MiB (bottom) per switch against the number of switches, one
    panel per file set, SDUDP solid and TCP dashed, a colour per loss rate;
    20 ms lines only (the paper's)."""
    d20 = [r for r in load if r["delay_ms"] == "20"]
    sets = sorted({r["set"] for r in d20})
    losses = sorted({r["loss_percent"] for r in d20}, key=float)
    switches = sorted({int(r["switches"]) for r in d20})
    cmap = plt.get_cmap("viridis")
    fig, axes = plt.subplots(2, len(sets), figsize=(3.2 * len(sets) + 1, 7), squeeze=False,
                             sharey="row")
    for j, s in enumerate(sets):
        for i, (col, scale, unit, fig_no) in enumerate(
                [("frames_per_switch", 1.0, "frames", 8), ("bytes_per_switch", MIB, "MiB", 7)]):
            ax = axes[i][j]
            for k, p in enumerate(losses):
                color = cmap(k / max(1, len(losses) - 1) * 0.9)
                for t, style in (("sdudp", "-"), ("tcp", "--")):
                    pts = [(n, pick(t, switches=str(n), delay_ms="20", loss_percent=p, set=s,
                                    rate_mbit="0")) for n in switches]
                    pts = [(n, float(c[col]) / scale) for n, c in pts if c]
                    if pts:
                        ax.plot([x for x, _ in pts], [y for _, y in pts], style, marker="o",
                                markersize=3, color=color,
                                label="%s %s %%" % (t, p) if j == 0 else None)
            ax.set_xticks(switches)
            ax.grid(alpha=0.3)
            if i == 0:
                ax.set_title("set %s (cf. Figs. 7-8)" % s, fontsize=9)
            else:
                ax.set_xlabel("switches")
            if j == 0:
                ax.set_ylabel("%s per switch (cf. Fig. %d)" % (unit, fig_no))
    axes[0][0].legend(fontsize=7, ncol=2)
    return fig


def sdudp(d):
    """The SDUDP paper's figures from cells.csv (mean, 95 % interval):
    Figs. 7-8 (frames and bytes per switch against the number of switches,
    SDUDP and TCP, per file set, 20 ms lines), Fig. 10 (frames with and
    without accumulation) and Fig. 11 (time to send at 10 Mbit/s, and frames
    per switch, with the QUIC proxy where it was measured). A figure whose
    cells were not measured is not drawn."""
    data = rows(os.path.join(d, "cells.csv"))
    colors = {"sdudp": "#1f77b4", "tcp": "#d62728", "sdudp not accumulating": "#9ecae1",
              "quic-proxy": "#2ca02c"}

    def bars(ax, groups, series, value, ci, ylabel, title):
        width = 0.8 / max(1, len(series))
        for i, (name, cells) in enumerate(series):
            xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
            ax.bar(xs, [value(c) if c else 0 for c in cells], width,
                   yerr=[ci(c) if c else 0 for c in cells], capsize=3, label=name,
                   color=colors.get(name, colors.get(name.split()[0])))
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels(groups, fontsize=8)
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=8)

    def find(**kv):
        for r in data:
            if all(r[k] == v for k, v in kv.items()):
                return r
        return None

    def pick(t, **kv):
        # SDUDP's default line: every engine, accumulating.
        if t == "sdudp":
            kv.update(engines="all", accumulate="true")
        return find(transport=t, **kv)

    # Figs. 7-8: all engines, accumulating, no rate limit.
    load = [r for r in data if r["rate_mbit"] == "0" and r["engines"] in ("all", "-")
            and (r["transport"] == "tcp" or r["accumulate"] == "true")]
    if load:
        # Cells with both transports only: the figures compare them.
        groups = sorted({(int(r["switches"]), r["delay_ms"], r["loss_percent"], r["set"])
                         for r in load if r["transport"] == "tcp"})
        if len(groups) > 24:
            # A full grid: one bar pair per cell would not read.
            save(load_lines(load, pick), d, "sdudp-load.png")
        else:
            labels = ["%d sw %s ms\n%s %% set %s" % g for g in groups]
            # One panel above the other: a grid of many cells stays readable.
            fig, axes = plt.subplots(2, 1, figsize=(max(7, 0.8 * len(groups)), 8),
                                     squeeze=False)
            for ax, col, ci, unit, scale, fig_no in [
                    (axes[0][0], "frames_per_switch", "frames_ci95", "frames", 1.0, 8),
                    (axes[1][0], "bytes_per_switch", "bytes_ci95", "MiB", MIB, 7)]:
                series = [(t, [pick(t, switches=str(g[0]), delay_ms=g[1],
                                    loss_percent=g[2], set=g[3], rate_mbit="0")
                               for g in groups])
                          for t in ("sdudp", "tcp")]
                bars(ax, labels, series, lambda c, col=col: float(c[col]) / scale,
                     lambda c, ci=ci: float(c[ci]) / scale,
                     "%s per switch" % unit, "%s per switch (cf. Fig. %d)" % (unit, fig_no))
            save(fig, d, "sdudp-load.png")
    # Fig. 10: SDUDP with and without accumulation (all engines, no rate limit),
    # and TCP.
    acc = [r for r in data if r["transport"] == "sdudp" and r["accumulate"] == "false"]
    if acc:
        groups = sorted({(r["switches"], r["delay_ms"], r["loss_percent"], r["set"]) for r in acc})
        labels = ["%s sw %s ms %s %%\nset %s" % g for g in groups]
        series = [("sdudp %s" % name, [find(transport="sdudp", accumulate=a, switches=g[0],
                                            delay_ms=g[1], loss_percent=g[2], set=g[3],
                                            rate_mbit="0", engines="all") for g in groups])
                  for name, a in (("accumulating", "true"), ("not accumulating", "false"))]
        # Fig. 10's third bar: TCP on the same line, where it was measured.
        tcp = [find(transport="tcp", switches=g[0], delay_ms=g[1], loss_percent=g[2],
                    set=g[3], rate_mbit="0") for g in groups]
        if any(tcp):
            series.append(("tcp", tcp))
        fig, ax = plt.subplots(figsize=(max(5, 1.6 * len(groups)), 4))
        bars(ax, labels, series, lambda c: float(c["frames_per_switch"]),
             lambda c: float(c["frames_ci95"]), "frames per switch",
             "accumulation (cf. Fig. 10)")
        save(fig, d, "sdudp-accumulation.png")
    # Fig. 11: time to send at a limited rate (and the QUIC proxy, where it
    # was measured on the same line).
    timed = [r for r in data if r["rate_mbit"] != "0"]
    carriers = [t for t in ("sdudp", "tcp", "quic-proxy") if any(r["transport"] == t for r in timed)]
    if timed:
        groups = sorted({(r["switches"], r["delay_ms"], r["loss_percent"], r["rate_mbit"], r["set"])
                         for r in timed})
        labels = ["%s sw %s ms %s %%\n%s Mbit/s set %s" % g for g in groups]
        series = [(t, [pick(t, switches=g[0], delay_ms=g[1], loss_percent=g[2],
                            rate_mbit=g[3], set=g[4]) for g in groups]) for t in carriers]
        fig, axes = plt.subplots(1, 2, figsize=(max(9, 3.2 * len(groups)), 4), squeeze=False)
        bars(axes[0][0], labels, series, lambda c: float(c["seconds"]),
             lambda c: float(c["seconds_ci95"]), "time to send (s)", "time to send (cf. Fig. 11)")
        bars(axes[0][1], labels, series, lambda c: float(c["frames_per_switch"]),
             lambda c: float(c["frames_ci95"]), "frames per switch", "frames per switch, same runs")
        save(fig, d, "sdudp-time.png")


if __name__ == "__main__":
    kind, d = sys.argv[1], sys.argv[2]
    {"overhead": overhead, "delay": delay, "table1": table1, "model": model, "hol": hol,
     "migration": migration, "reconnect": reconnect, "storm": storm,
     "bicast": bicast, "sdudp": sdudp}[kind](d)
