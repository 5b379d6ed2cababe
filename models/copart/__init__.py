"""CoPart: coordinated LLC and memory-bandwidth partitioning for fairness (EuroSys'19,
sections 5.1-5.4; docs/CONTROLLERS.md summarises it).

Unfairness = sigma/mu of the batch applications' slowdowns, slowdown = IPS(full) / IPS(now)
with IPS(full) from the profiling phase (section 2, eq. 2). One *application* is one batch
group (its counters are the group's; system groups count as batch). Three phases
(section 5.4, Figure 10):

1. **Profiling** (5.4.1): each application briefly at full resources, at (l_p=2 ways, MBA
   100%) and at (all ways, M_p=20%); the others meanwhile are confined to the top way at the
   lowest MBA level (during the (l_p, 100%) run they share the other ways at the equal MBA
   share instead), so the runs happen online on a busy node. More than 10% degradation at
   (l_p, 100%) makes the LLC classifier start in DEMAND, at (L, M_p) the bandwidth one.
   Otherwise (our reading): SUPPLY when the application is insensitive (degradation <=
   delta_p, or it is "low" as below), MAINTAIN in between.
2. **Exploration** (5.4.2): Algorithm 1 — from the equal state, every *period* (the paper
   gives no length; default four control intervals of which only the last is measured,
   because occupancy takes about 0.3 s to follow a mask change on the simulator) update
   the FSMs, compute Algorithm 2's next state; when it equals the current one, move to a
   random neighbour (one way or one MBA step from a random donor to a random receiver) at
   most theta=3 times (the counter is not reset, as in the pseudocode), then go idle; a
   return to any state visited in this exploration counts as a repeat too (two apps trading
   one unit back and forth would otherwise never stop). Our addition at that exit: a move of
   the last step (Algorithm 2's or the random neighbour's) whose donor now demands what it
   gave, with nobody able to give it back, is undone rather than left in place.
   Algorithm 2 — Hospitals/Residents matching: hospitals are the resource types LLC, MBA and
   ANY with as many positions as producers of that type; consumers (residents) apply in
   preference order (an LLC consumer prefers LLC then ANY; MBA likewise; an ANY consumer a
   random order of LLC/MBA, then ANY); an oversubscribed type rejects its lowest-slowdown
   tentative consumer, who applies to its next preference (instability chaining). Then
   each matched consumer takes one unit from the lowest-slowdown producer of that type.
3. **Idle** (5.4.3): monitor only; exploration restarts on a change: an application starts
   or stops (IPS appears or vanishes), a load shift (an LC service's requests over its last
   ``confirm`` intervals differ from what its rate over the five intervals before idle
   entry predicts by more than ``lc_shift``, default 25%, and by more than four Poisson
   standard deviations — a service answering tens of requests per interval is noisy;
   with ``watch_ips`` also a batch application's IPS by more than ``shift``, default
   2 x delta_p — off by default, since
   batch jobs' own phases, e.g. Spark's map and reduce, are not a change in the paper's
   sense and would re-trigger exploration every phase), or the resources available to
   batch change; a new group set restarts from profiling. On re-adaptation (our reading;
   Figure 10 is lost) the FSMs keep their states, except that an application that lost
   more than delta_p since idle entry demands the LLC when its miss ratio rose by more than
   beta and bandwidth otherwise; after an application start/stop they restart from the
   profile's initial states.

Missing measurements (our addition; the paper assumes every interval is counted): an
interval whose counters could not be read (an error, which the tuner logs) or with a count
that is not a finite number (NaN: a PMC event multiplexed out of the interval) is no
measurement. A profiling run or an exploration period is then measured again next interval
under the plan still held (after as many NaN intervals in a row as the run or period is
long, it goes on without that application's); the idle phase skips the interval for that
application.

FSMs (Figures 8 and 9 did not survive as text; reconstructed from sections 5.2-5.3; g is
the relative IPS change since just before the application's last move — a move's effect
builds up over periods as occupancy follows the mask; "gained/lost" is what that step moved,
recorded per resource, since Algorithm 2 can take a way from an application and give it an
MBA step in one step: each machine sees its own resource's move, the other's only where a
rule below names it):

- LLC: after losing a way, g <= -delta_p -> DEMAND (checked first: the way was needed);
  otherwise *low* = LLC access rate < alpha=1.5e6/s or miss ratio < B=3% -> SUPPLY from any
  state. DEMAND: after gaining a way, stays DEMAND if g >= delta_p=5%, else MAINTAIN;
  without a change it keeps demanding. MAINTAIN -> DEMAND when performance falls by
  delta_p (contention grew, or a random neighbour move took a way) unless what it lost was
  an MBA step. SUPPLY: after losing a way, -> MAINTAIN if the miss ratio rose by more than
  beta=1 point (the way was in use), else stays SUPPLY.
- Bandwidth: memory traffic ratio r = LLC miss rate / STREAM's at the same MBA level.
  After losing an MBA step, g <= -delta_p -> DEMAND (checked first: a throttled app's
  traffic looks light); otherwise r < gamma=10% -> SUPPLY from any state. DEMAND: after
  gaining an MBA step, stays DEMAND if g >= delta_p else MAINTAIN; after gaining an LLC way
  it stays DEMAND even when the gain is small (the paper's coupling rule). MAINTAIN ->
  DEMAND only when performance fell by delta_p, and then if it lost an MBA step, or if its
  traffic is heavy (r > Gamma=30%) and it did not lose an LLC way. Heavy traffic alone does
  not move it: MAINTAIN is where one more unit gains little (section 5.2's meaning, which
  5.3 carries over: "designed similarly to the LLC characteristic classifier"), entered
  after a small gain at the same r, so r > Gamma alone would send every heavy application
  back to DEMAND a period after each such verdict; section 5.5.3's "with large [Gamma],
  applications that incur high memory traffic may fail to demand" holds for this reading
  too. SUPPLY -> MAINTAIN when r > Gamma.

Bandwidth as a resource: Algorithm 2 moves "a level-up in the MBA setting" from producers to
consumers, so the batch applications share a fixed budget of MBA steps: the node's levels
at 10%, 20%, ..., 100% (:func:`models.search.mb_grid`), ten steps in all, each application at
least one (the equal state gives each about 100%/N). STREAM's miss rate per MBA level comes
from a profile (:func:`profile_stream` drives any node on which a group runs STREAM; on the
simulator :func:`stream_profile_sim` profiles STREAM once on a node of the same preset);
without one it is estimated as peak bandwidth / (64 B x 1.5) x level (documented fallback).
Without MBA only the LLC classifier runs.

LC services (section 6.3's case study): CoPart itself only balances batch applications; the
paper sizes the LC service with a separate dynamic manager (like Heracles/PARTIES). Here:
LC groups hold contiguous low ways at full bandwidth, starting at ``lc_ways`` (default the
equal share); one more way when their SLO percentile exceeds ``grow_at`` x target, one
less (never below the start) after ``shrink_after`` intervals under ``shrink_at`` x target.
Batch applications share what is left; a change re-triggers adaptation. Being a separate
manager, it applies each change at once in every phase, profiling included (the profiling
run then starts over on its new batch ways), so its next step is judged on the last one.
"""

from models.copart.apps import (
    ALPHA,
    ANY,
    B_MISS,
    BETA,
    DELTA_P,
    GAMMA_HI,
    GAMMA_LO,
    L_P,
    LLC,
    M_P,
    MBA,
    PROFILE_DEGRADATION,
    THETA,
    App,
    Fsm,
    Measure,
    Phase,
)
from models.copart.controller import CoPart, phases
from models.copart.stream import profile_stream, stream_estimate, stream_profile_sim

__all__ = [
    "ALPHA",
    "ANY",
    "BETA",
    "B_MISS",
    "DELTA_P",
    "GAMMA_HI",
    "GAMMA_LO",
    "LLC",
    "L_P",
    "MBA",
    "M_P",
    "PROFILE_DEGRADATION",
    "THETA",
    "App",
    "CoPart",
    "Fsm",
    "Measure",
    "Phase",
    "phases",
    "profile_stream",
    "stream_estimate",
    "stream_profile_sim",
]
