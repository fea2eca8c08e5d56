"""A client's host statistics (/v1/client/stats): the simulated clients all run on this
host, so the figures are this host's, read as Nomad's client reads them (gopsutil)."""

from __future__ import annotations

import contextlib
import os
import time

from controller.lab.simulator.util import JSON


def host_stats(alloc_dir: str) -> JSON:
    disk = _disk(alloc_dir)
    return {
        "Memory": _memory(),
        "CPU": None,
        "DiskStats": [disk],
        "AllocDirStats": disk,
        "DeviceStats": None,
        "Uptime": _uptime(),
        "Timestamp": time.time_ns(),
        "CPUTicksConsumed": 0,
    }


def _memory() -> JSON:
    """Total, available, used and free bytes (Linux: /proc/meminfo)."""
    fields: dict[str, int] = {}
    with contextlib.suppress(OSError), open("/proc/meminfo") as meminfo:
        for line in meminfo:
            name, _, value = line.partition(":")
            parts = value.split()
            if parts and parts[0].isdigit():
                fields[name] = int(parts[0]) * 1024
    total = fields.get("MemTotal") or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    available = fields.get("MemAvailable", fields.get("MemFree", 0))
    return {
        "Total": total,
        "Available": available,
        "Used": total - available,
        "Free": fields.get("MemFree", 0),
    }


def _disk(path: str) -> JSON:
    """The file system holding `path`: sizes in bytes and how full it is (gopsutil's
    usage: used over used and available, as df shows it)."""
    fs = os.statvfs(path)
    size = fs.f_blocks * fs.f_frsize
    used = (fs.f_blocks - fs.f_bfree) * fs.f_frsize
    available = fs.f_bavail * fs.f_frsize
    inodes_used = fs.f_files - fs.f_ffree
    return {
        "Device": "",
        "Mountpoint": path,
        "Size": size,
        "Used": used,
        "Available": available,
        "UsedPercent": 100.0 * used / (used + available) if used + available else 0.0,
        "InodesUsedPercent": 100.0 * inodes_used / fs.f_files if fs.f_files else 0.0,
    }


def _uptime() -> int:
    with contextlib.suppress(OSError, ValueError), open("/proc/uptime") as uptime:
        return int(float(uptime.read().split()[0]))
    return 0
