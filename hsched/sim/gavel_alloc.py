"""Gavel's allocations over time fractions, solved the way Gavel's simulator solves them.

Gavel (Narayanan et al., OSDI 2020) turns a policy into an optimisation over an allocation matrix X: X[i][t] is
the fraction of wall-clock time job i should spend on GPU type t (a gang of s GPUs uses s GPUs for that time).
Every policy shares the constraints

    X >= 0,   sum_t X[i][t] <= 1   (a job runs on one type at a time),
    sum_i s_i X[i][t] <= capacity[t]   (a type is not over-committed),

and maximises its own objective:

* LAS (max-min fairness, blind to types): max min_i s_i * sum_t X[i][t];
* heterogeneity-aware LAS: max min_i s_i * (throughput_i . X_i) / isolated_i, where isolated_i is the job's
  throughput under the type-blind allocation (its "1/n of the cluster");
* finish-time fairness: min max_i (T_i + R_i / (throughput_i . X_i)) / (T_i + R_i / isolated_i), T_i the time
  since the job arrived and R_i its remaining steps.

Those problems have many optimal allocations (all uncapped jobs sit at the same normalised rate, but which types
give it, and what a job that could have more receives, is free). Gavel hands them to an interior-point solver
(ECOS through cvxpy), which returns a point near the analytic centre of the optimal face. This module does the
same with a log-barrier method and lets the barrier weight go to ~0, so it lands on (nearly) the same point, not
on an arbitrary vertex: that choice decides which jobs run on which type in light load, and is part of the
figures being reproduced.

Jobs that are indistinguishable to the problem (same coefficients and scale) are solved as one group with a
weight (the job-level barrier, restricted to symmetric solutions, is the group barrier times the count), so a
het-LAS problem has as many blocks as job kinds, not jobs. Each Newton step is linear in the blocks: a block-
diagonal Hessian plus one coupling scalar (t or rho) plus a rank-(number of types) capacity term, solved with the
Woodbury identity. numpy does the batched small-matrix work; it is imported by this module only (the optional
`gavel` extra), so nothing else in the package needs it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_FRACTION_TO_BOUNDARY = 0.99


def _newton_direction(
    d_blocks: np.ndarray, b_blocks: np.ndarray, h: float, qk: np.ndarray, s_inv: np.ndarray,
    gx: np.ndarray, gt: float, m: int,
) -> tuple[np.ndarray, float]:
    """Solve [[D + Q Q^T, b], [b^T, h]] [dx; dt] = [gx; gt].

    D is block diagonal (K blocks of size d), b has the same shape as the blocks' vectors, and Q couples the
    first m entries of every block through the capacities: Q[(k, j), j] = qk[k] / S_j.
    """
    # Jacobi-scaled inversion: near the optimum a block mixes entries of very different sizes (1/x^2 for a type
    # the job nearly never uses), which a plain inverse loses to rounding
    diag = np.sqrt(np.einsum("kii->ki", d_blocks))
    scaled = d_blocks / (diag[:, :, None] * diag[:, None, :])
    d_inv = np.linalg.inv(scaled) / (diag[:, :, None] * diag[:, None, :])  # (K, d, d)
    # M = I + Q^T D^-1 Q  (m x m)
    sub = d_inv[:, :m, :m]  # (K, m, m)
    m_mat = np.eye(m) + np.einsum("k,kjl->jl", qk * qk, sub) * np.outer(s_inv, s_inv)
    m_inv = np.linalg.inv(m_mat)

    def a_inv(w: np.ndarray) -> np.ndarray:
        dw = np.einsum("kij,kj->ki", d_inv, w)  # D^-1 w
        qt = s_inv * np.einsum("k,kj->j", qk, dw[:, :m])  # Q^T D^-1 w
        y = m_inv @ qt
        qy = np.zeros_like(w)
        qy[:, :m] = np.outer(qk, s_inv * y)  # Q y
        return dw - np.einsum("kij,kj->ki", d_inv, qy)

    p = a_inv(gx)
    r = a_inv(b_blocks)
    denom = h - float(np.sum(b_blocks * r))
    if not denom > 0.0 or not np.isfinite(denom):
        # the Schur complement lost to rounding: only happens this close to the optimum
        raise np.linalg.LinAlgError("Schur complement lost to rounding")
    dt = (gt - float(np.sum(b_blocks * p))) / denom
    return p - r * dt, dt


def _max_step(values: np.ndarray, deltas: np.ndarray) -> float:
    """The largest step a <= 1 keeping values + a * deltas > 0, pulled back from the boundary."""
    neg = deltas < 0
    if not np.any(neg):
        return 1.0
    return float(min(1.0, _FRACTION_TO_BOUNDARY * np.min(-values[neg] / deltas[neg])))


def max_min(coef: np.ndarray, scale: np.ndarray, counts: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """Per-group time fractions X (K x m) for: max t s.t. coef_k . X_k >= t, sum_t X_k <= 1, X >= 0,
    sum_k counts_k * scale_k * X_k[t] <= capacity[t] -- at (nearly) the analytic centre of the optimal face.

    A type with no capacity gets no time. Rows of `coef` may contain zeros (a type the job cannot run on).
    """
    k_n, m_all = coef.shape
    live = capacity > 0
    if not np.any(live) or k_n == 0:
        return np.zeros((k_n, m_all))
    c = coef[:, live]
    cap = capacity[live]
    m = c.shape[1]
    n = counts.astype(float)
    qk = n * scale
    demand = float(np.sum(qk))
    alpha = 0.5 * min(1.0 / m, float(np.min(cap)) / demand)
    x = np.full((k_n, m), alpha)
    t = 0.5 * float(np.min(np.sum(c * x, axis=1)))
    top = float(np.max(np.sum(c, axis=1))) or 1.0
    mu = top
    # stop where the duality gap (mu times the number of barrier terms) is what an interior-point solver's
    # default tolerance leaves (1e-8, relative): closer to the limit only loses precision
    mu_end = 1e-8 * top / (float(np.sum(n)) * (m + 2) + m)
    stuck = False
    while not stuck:
        for _ in range(80):
            u = np.sum(c * x, axis=1) - t
            v = 1.0 - np.sum(x, axis=1)
            s = cap - qk @ x
            s_inv = 1.0 / s
            # gradient of the barrier B (to be minimised together with -t / mu)
            gx = n[:, None] * (-(c / u[:, None]) + (1.0 / v)[:, None] - 1.0 / x) + np.outer(qk, s_inv)
            gt = float(np.sum(n / u)) - 1.0 / mu
            w_u = n / (u * u)
            d_blocks = (w_u[:, None, None] * np.einsum("ki,kj->kij", c, c)
                        + (n / (v * v))[:, None, None] * np.ones((1, m, m)))
            idx = np.arange(m)
            d_blocks[:, idx, idx] += n[:, None] / (x * x)
            b_blocks = -w_u[:, None] * c
            h = float(np.sum(w_u))
            try:
                dx, dt = _newton_direction(d_blocks, b_blocks, h, qk, s_inv, -gx, -gt, m)
            except np.linalg.LinAlgError:
                stuck = True
                break
            decrement = -(float(np.sum(gx * dx)) + gt * dt)
            if decrement < 1e-10:
                break
            du = np.sum(c * dx, axis=1) - dt
            dv = -np.sum(dx, axis=1)
            ds = -(qk @ dx)
            a = min(_max_step(x.ravel(), dx.ravel()), _max_step(u, du), _max_step(v, dv), _max_step(s, ds))
            f0 = -t / mu - float(np.sum(n * (np.log(u) + np.log(v) + np.sum(np.log(x), axis=1)))) \
                - float(np.sum(np.log(s)))
            while a > 1e-12:
                x1, t1 = x + a * dx, t + a * dt
                u1 = np.sum(c * x1, axis=1) - t1
                v1 = 1.0 - np.sum(x1, axis=1)
                s1 = cap - qk @ x1
                if np.all(u1 > 0) and np.all(v1 > 0) and np.all(s1 > 0) and np.all(x1 > 0):
                    f1 = -t1 / mu - float(np.sum(n * (np.log(u1) + np.log(v1) + np.sum(np.log(x1), axis=1)))) \
                        - float(np.sum(np.log(s1)))
                    if f1 <= f0 - 0.25 * a * decrement:
                        break
                a *= 0.5
            x, t = x + a * dx, t + a * dt
        if mu <= mu_end:
            break
        mu *= 0.1
    out = np.zeros((k_n, m_all))
    out[:, live] = np.clip(x, 0.0, 1.0)
    return out


def finish_time_fair(tput: np.ndarray, scale: np.ndarray, since_start: np.ndarray, remaining: np.ndarray,
                     isolated: np.ndarray, capacity: np.ndarray,
                     isolated_so_far: np.ndarray | None = None) -> np.ndarray:
    """Per-job time fractions X (n x m) for Gavel's finish-time fairness:

        min rho  s.t.  (T_i + R_i / a_i) / E_i <= rho, i.e. a_i (rho E_i - T_i) >= R_i,  a_i = tput_i . X_i,
                       sum_t X_i <= 1, X >= 0, sum_i scale_i X_i[t] <= capacity[t]

    with E_i = T_i + R_i / isolated_i (the finish time under the isolated share), or, given `isolated_so_far`
    (Gavel's FinishTimeFairnessPolicyWithPerf), E_i = isolated_so_far_i + R_i / isolated_i: the time the work
    already done would have taken on the isolated share, not the time since arrival. Gavel's solver sees the ratio
    through an epigraph variable sigma_i >= 1 / a_i (a second-order cone) and rho >= (T_i + R_i sigma_i) / E_i;
    minimising its barrier over sigma_i in closed form leaves 2 log g_i - log a_i with g_i = a_i (rho E_i - T_i)
    - R_i, which is the barrier used here: the same centre, one variable fewer per job.
    """
    n_jobs, m_all = tput.shape
    live = capacity > 0
    if not np.any(live) or n_jobs == 0:
        return np.zeros((n_jobs, m_all))
    tp = tput[:, live]
    cap = capacity[live]
    m = tp.shape[1]
    e = (since_start if isolated_so_far is None else isolated_so_far) + remaining / isolated
    qk = scale.astype(float)
    alpha = 0.5 * min(1.0 / m, float(np.min(cap)) / float(np.sum(qk)))
    x = np.full((n_jobs, m), alpha)
    a0 = np.sum(tp * x, axis=1)
    rho = float(np.max((since_start + 2.0 * remaining / a0) / e))
    mu = rho
    mu_end = 1e-8 * rho / (n_jobs * (m + 3) + m)
    idx = np.arange(m)

    def slacks(x: np.ndarray, rho: float) -> tuple[np.ndarray, ...]:
        a = np.sum(tp * x, axis=1)
        y = rho * e - since_start
        return a * y - remaining, 1.0 - np.sum(x, axis=1), cap - qk @ x, a, y

    def objective(x: np.ndarray, rho: float, mu: float) -> float:
        g, v, s, a, y = slacks(x, rho)
        if np.any(g <= 0) or np.any(v <= 0) or np.any(s <= 0) or np.any(x <= 0) or np.any(y <= 0):
            return np.inf
        return rho / mu - float(np.sum(2.0 * np.log(g) - np.log(a) + np.log(v) + np.sum(np.log(x), axis=1))) \
            - float(np.sum(np.log(s)))

    stuck = False
    while not stuck:
        for _ in range(120):
            g, v, s, a, y = slacks(x, rho)
            s_inv = 1.0 / s
            gx = (-2.0 * y / g + 1.0 / a)[:, None] * tp + (1.0 / v)[:, None] - 1.0 / x + np.outer(qk, s_inv)
            gt = 1.0 / mu - float(np.sum(2.0 * a * e / g))
            # Hessian of -2 log g + log a, g = a * y - R, a linear in x, y linear in rho: grad g = (y tp, a e)
            w2 = 2.0 / (g * g)
            blocks = (w2 * y * y - 1.0 / (a * a))[:, None, None] * np.einsum("ki,kj->kij", tp, tp)
            blocks += (1.0 / (v * v))[:, None, None]
            blocks[:, idx, idx] += 1.0 / (x * x)
            b_blocks = (w2 * y * a * e)[:, None] * tp - (2.0 * e / g)[:, None] * tp
            h = float(np.sum(w2 * (a * e) ** 2))
            try:
                dx, dr = _newton_direction(blocks, b_blocks, h, qk, s_inv, -gx, -gt, m)
            except np.linalg.LinAlgError:
                stuck = True
                break
            decrement = -(float(np.sum(gx * dx)) + gt * dr)
            if decrement < 1e-10:
                break
            step = _max_step(x.ravel(), dx.ravel())
            f0 = objective(x, rho, mu)
            while step > 1e-12:
                if objective(x + step * dx, rho + step * dr, mu) <= f0 - 0.25 * step * decrement:
                    break
                step *= 0.5
            x, rho = x + step * dx, rho + step * dr
        if mu <= mu_end:
            break
        mu *= 0.1
    out = np.zeros((n_jobs, m_all))
    out[:, live] = np.clip(x, 0.0, 1.0)
    return out


def group_rows(coef: np.ndarray, scale: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[int]]:
    """Identical (coefficient row, scale) pairs as one group: (group coef, group scale, counts, group of each row)."""
    keys: dict[tuple[tuple[float, ...], int], int] = {}
    of_row: list[int] = []
    for row, s in zip(coef.tolist(), scale, strict=True):
        key = (tuple(row), int(s))
        g = keys.get(key)
        if g is None:
            g = keys[key] = len(keys)
        of_row.append(g)
    g_coef = np.array([k[0] for k in keys], dtype=float).reshape(len(keys), coef.shape[1])
    g_scale = np.array([k[1] for k in keys], dtype=float)
    counts = np.bincount(np.array(of_row, dtype=int), minlength=len(keys)).astype(float)
    return g_coef, g_scale, counts, of_row
