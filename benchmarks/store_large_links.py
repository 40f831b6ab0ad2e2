"""The papers' citations of ``store_large``'s graph predicted from its store (the link task).

``python benchmarks/figures.py store_large_links`` writes on_disk_graph's ``store_large_links``
block: ``gnnscale fit`` of the link recipe on a graph written as ``store_large`` writes its own
(see its docstring), one process and two ranks under ``torchrun``.
"""

from __future__ import annotations

import numpy as np
import torch
from blocks import Block, Section
from mag_graph import CITES
from store_large import LINK_CANDIDATES, LINK_METRIC, SHAPES, _block, _measured


def blocks(tiny: bool) -> list[Block]:
    """on_disk_graph README's ``store_large_links`` block: the link task on its own graph."""
    r, s = _measured(tiny, links=True), SHAPES["tiny" if tiny else "full"]
    one, two, batches, size = r["links_1"], r["links_2"], s["link_batches"], f"{s['batch_size']:,}"
    deep = float(np.median([r["deep"], r["deep_after"]]))
    held = f"{int(s['held_out'] * s['papers'] * CITES):,}"
    text = "\n".join(
        [
            "| link prediction: papers' citations | one process | two ranks (torchrun) |",
            "|---|---:|---:|",
            f"| `gnnscale fit`, whole run (2 epochs of {batches} batches of {size} citations "
            f"a process, the first cold; validation, test) | {one['fit_s']:,.0f} s | "
            f"{two['fit_s']:,.0f} s |",
            f"| s/batch, first epoch (cold page cache) / second | "
            f"{one['epoch_s'][0] / batches:.2f} / {one['epoch_s'][1] / batches:.2f} | "
            f"{two['epoch_s'][0] / batches:.2f} / {two['epoch_s'][1] / batches:.2f} |",
            f"| validation, s ({held} held-out citations, their sources each ranking "
            f"{LINK_CANDIDATES:,} papers; a rank its share), first / second | "
            f"{' / '.join(f'{v:.0f}' for v in one['val_s'])} | "
            f"{' / '.join(f'{v:.0f}' for v in two['val_s'])} |",
            f"| device reads/s while busy (share of the disk's random 4-KiB rate at depth 32, "
            f"{deep:,.0f}) | "
            f"{one['busy_reads_per_s']:,.0f} ({one['busy_reads_per_s'] / deep:.0%}) | "
            f"{two['busy_reads_per_s']:,.0f} ({two['busy_reads_per_s'] / deep:.0%}) |",
            f"| peak private memory, trainer / loader worker (per rank) | "
            f"{one['private_mb'][0]:,.0f} / {one['private_mb'][1]:,.0f} MiB | "
            f"{two['private_mb'][0]:,.0f} / {two['private_mb'][1]:,.0f} MiB |",
            f"| test {LINK_METRIC} ({held} held-out citations) / the most cited papers' | "
            f"{one['test'][f'test/{LINK_METRIC}']:.3f} / "
            f"{one['test'][f'test/{LINK_METRIC}_popularity']:.3f} | "
            f"{two['test'][f'test/{LINK_METRIC}']:.3f} / "
            f"{two['test'][f'test/{LINK_METRIC}_popularity']:.3f} |",
        ]
    )
    return _block(tiny, "store_large_links", text)


SECTION = Section(
    run=lambda tiny, _: blocks(tiny),
    about="store_large's graph written again and its citations predicted by one process and two "
    "ranks (about 40 minutes and more, 50 GiB of disk)",
    writes="store_large_links in on_disk_graph's README",
    threads=f"{torch.get_num_threads()} torch threads, 1 loader worker a rank",
    on_request=True,
    formerly=("store-large-links",),
)
