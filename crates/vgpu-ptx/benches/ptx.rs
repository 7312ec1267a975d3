//! The executor against plain Rust loops doing the same work, one core
//! each: vector add, a tiled matrix multiply, a shuffle reduction, and
//! CUB's block radix sort and block reduction (the corpus kernels; CUB's
//! are what Thrust's sort and CUB's device-wide reduce run per block). Prints the time of each, the ratio and the executor's
//! thread-instructions per second.
//!
//! usage: cargo bench -p vgpu-ptx [-- WORKERS]
//!
//! The smoke run, `cargo bench -p vgpu-ptx --bench ptx -- --test` (or
//! `cargo test -p vgpu-ptx --bench ptx`, which runs the binary without
//! `--bench`), runs every part for a fraction of a second and exits
//! non-zero if one panics or measures nothing (a ratio without a
//! baseline); CI runs every benchmark so.

// The native loops index like the kernels they stand for.
#![allow(clippy::needless_range_loop)]

use std::hint::black_box;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use vgpu_benchkit::{Bench, Target};
use vgpu_ptx::{launch, GlobalMemory, LaunchConfig, LaunchStats, Limits, Module, VecMemory};

const BASE: u64 = 0x1000_0000;

fn time<T>(reps: usize, mut f: impl FnMut() -> T) -> (Duration, T) {
    // Best of `reps`: the machine may be shared.
    let mut best = Duration::MAX;
    let mut out = None;
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        let r = f();
        best = best.min(t.elapsed());
        out = Some(r);
    }
    (best, out.unwrap_or_else(|| unreachable!()))
}

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn params(m: &Module, k: &str, vals: &[&[u8]]) -> Vec<u8> {
    let info = m.kernel(k).unwrap_or_else(|| panic!("no kernel {k}"));
    let mut buf = vec![0u8; info.param_bytes as usize];
    for (p, v) in info.params.iter().zip(vals) {
        buf[p.offset as usize..][..v.len()].copy_from_slice(v);
    }
    buf
}

fn report(bench: &Bench, name: &str, native: Duration, exec: Duration, st: &LaunchStats) {
    let r = bench.ratio(
        name,
        exec.as_secs_f64(),
        native.as_secs_f64(),
        Target::Reference,
    );
    let ratio = r.value;
    let tips = st.thread_instructions as f64 / exec.as_secs_f64();
    println!(
        "{name:<14} native {:>9.3} ms   executor {:>9.3} ms   ratio {ratio:>6.1}x   {:>7.1} M thread-instr/s   ({} thread-instr) {}",
        native.as_secs_f64() * 1e3,
        exec.as_secs_f64() * 1e3,
        tips / 1e6,
        st.thread_instructions,
        r.verdict
    );
}

fn main() -> ExitCode {
    let bench = Bench::start();
    let workers: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(1);
    // A smoke run: once each, on small data.
    let smoke = bench.smoke();
    let reps = if smoke { 1 } else { 5 };
    println!(
        "vgpu-ptx executor vs plain Rust, {workers} worker(s) (native loops on one core){}",
        if smoke { " (smoke)" } else { "" }
    );
    let lim = Limits::default();

    // Vector add.
    {
        let m = Module::parse(include_str!("../tests/corpus/vector_add.ptx")).unwrap();
        let n = if smoke { 1 << 14 } else { 1 << 20 };
        let a: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let b: Vec<f32> = (0..n).map(|i| (n - i) as f32).collect();
        let mem = VecMemory::new(BASE, 3 * n * 4);
        mem.write(BASE, &bytes(&a)).unwrap();
        mem.write(BASE + n as u64 * 4, &bytes(&b)).unwrap();
        let pc = BASE + 2 * n as u64 * 4;
        let p = params(
            &m,
            "vector_add",
            &[
                &BASE.to_le_bytes(),
                &(BASE + n as u64 * 4).to_le_bytes(),
                &pc.to_le_bytes(),
                &(n as i32).to_le_bytes(),
            ],
        );
        let cfg = LaunchConfig {
            grid: [(n / 256) as u32, 1, 1],
            block: [256, 1, 1],
            shared_dyn: 0,
            workers,
        };
        let (te, st) = time(reps, || {
            launch(&m, "vector_add", &cfg, &p, &mem, &lim).unwrap()
        });
        let (tn, _) = time(reps, || {
            let mut c = vec![0f32; n];
            for i in 0..n {
                c[i] = black_box(a[i]) + b[i];
            }
            black_box(c)
        });
        report(&bench, "vector add", tn, te, &st);
    }

    // Tiled matrix multiply.
    {
        let m = Module::parse(include_str!("../tests/corpus/matmul.ptx")).unwrap();
        let n = if smoke { 64usize } else { 256 };
        let a: Vec<f32> = (0..n * n).map(|i| (i % 7) as f32).collect();
        let b: Vec<f32> = (0..n * n).map(|i| (i % 5) as f32).collect();
        let mem = VecMemory::new(BASE, 3 * n * n * 4);
        mem.write(BASE, &bytes(&a)).unwrap();
        let pb = BASE + (n * n * 4) as u64;
        let pc = pb + (n * n * 4) as u64;
        mem.write(pb, &bytes(&b)).unwrap();
        let p = params(
            &m,
            "matmul",
            &[
                &BASE.to_le_bytes(),
                &pb.to_le_bytes(),
                &pc.to_le_bytes(),
                &(n as i32).to_le_bytes(),
            ],
        );
        let g = (n / 16) as u32;
        let cfg = LaunchConfig {
            grid: [g, g, 1],
            block: [16, 16, 1],
            shared_dyn: 0,
            workers,
        };
        let (te, st) = time(reps, || launch(&m, "matmul", &cfg, &p, &mem, &lim).unwrap());
        let (tn, c) = time(reps, || {
            let mut c = vec![0f32; n * n];
            for i in 0..n {
                for j in 0..n {
                    let mut acc = 0f32;
                    for k in 0..n {
                        acc += a[i * n + k] * b[k * n + j];
                    }
                    c[i * n + j] = acc;
                }
            }
            black_box(c)
        });
        let mut got = vec![0u8; n * n * 4];
        mem.read(pc, &mut got).unwrap();
        let ok = got
            .chunks(4)
            .zip(&c)
            .all(|(g, w)| f32::from_le_bytes([g[0], g[1], g[2], g[3]]) == *w);
        assert!(ok, "matmul result differs");
        report(&bench, &format!("matmul {n}"), tn, te, &st);
    }

    // Reduction with warp shuffles.
    {
        let m = Module::parse(include_str!("../tests/corpus/reduce_shfl.ptx")).unwrap();
        let n = if smoke { 1 << 14 } else { 1 << 20 };
        let v: Vec<f32> = (0..n).map(|i| (i % 3) as f32).collect();
        let mem = VecMemory::new(BASE, n * 4 + 256);
        mem.write(BASE, &bytes(&v)).unwrap();
        let pout = BASE + n as u64 * 4;
        let p = params(
            &m,
            "reduce_shfl",
            &[
                &BASE.to_le_bytes(),
                &pout.to_le_bytes(),
                &(n as i32).to_le_bytes(),
            ],
        );
        let cfg = LaunchConfig {
            grid: [64, 1, 1],
            block: [256, 1, 1],
            shared_dyn: 0,
            workers,
        };
        let (te, st) = time(reps, || {
            launch(&m, "reduce_shfl", &cfg, &p, &mem, &lim).unwrap()
        });
        let (tn, _) = time(reps, || {
            let mut s = 0f32;
            for x in &v {
                s += black_box(*x);
            }
            black_box(s)
        });
        report(&bench, "reduce shfl", tn, te, &st);
    }

    let cub = Module::parse(include_str!("../tests/corpus/cub.ptx")).unwrap();
    // CUB's BlockRadixSort: tiles of 2048 ints, each sorted by a block.
    {
        let n = if smoke { 1 << 13 } else { 1 << 18 };
        let mut s = 1u32;
        let keys: Vec<i32> = (0..n)
            .map(|_| {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                s as i32
            })
            .collect();
        let kb: Vec<u8> = keys.iter().flat_map(|k| k.to_le_bytes()).collect();
        let mem = VecMemory::new(BASE, n * 4);
        let p = params(
            &cub,
            "cub_block_sort",
            &[&BASE.to_le_bytes(), &(n as i32).to_le_bytes()],
        );
        let cfg = LaunchConfig {
            grid: [(n / 2048) as u32, 1, 1],
            block: [128, 1, 1],
            shared_dyn: 0,
            workers,
        };
        let (te, st) = time(reps, || {
            mem.write(BASE, &kb).unwrap();
            launch(&cub, "cub_block_sort", &cfg, &p, &mem, &lim).unwrap()
        });
        let (tn, sorted) = time(reps, || {
            let mut k = black_box(keys.clone());
            for tile in k.chunks_mut(2048) {
                tile.sort_unstable();
            }
            k
        });
        let mut got = vec![0u8; n * 4];
        mem.read(BASE, &mut got).unwrap();
        let want: Vec<u8> = sorted.iter().flat_map(|k| k.to_le_bytes()).collect();
        assert!(got == want, "block sort result differs");
        report(&bench, "cub block sort", tn, te, &st);
    }
    // CUB's BlockReduce over a grid-stride loop, one atomic per block.
    {
        let n = if smoke { 1 << 14 } else { 1 << 20 };
        let v: Vec<i32> = (0..n).map(|i| (i % 7) as i32 - 3).collect();
        let mem = VecMemory::new(BASE, n * 4 + 8);
        let vb: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        mem.write(BASE, &vb).unwrap();
        let pout = BASE + n as u64 * 4;
        let p = params(
            &cub,
            "cub_block_reduce",
            &[
                &BASE.to_le_bytes(),
                &pout.to_le_bytes(),
                &(n as i32).to_le_bytes(),
            ],
        );
        let cfg = LaunchConfig {
            grid: [64, 1, 1],
            block: [256, 1, 1],
            shared_dyn: 0,
            workers,
        };
        let (te, st) = time(reps, || {
            mem.write(pout, &[0; 8]).unwrap();
            launch(&cub, "cub_block_reduce", &cfg, &p, &mem, &lim).unwrap()
        });
        let (tn, sum) = time(reps, || {
            let mut s = 0i64;
            for x in &v {
                s += black_box(*x) as i64;
            }
            s
        });
        let mut got = [0u8; 8];
        mem.read(pout, &mut got).unwrap();
        assert_eq!(i64::from_le_bytes(got), sum, "block reduce result differs");
        report(&bench, "cub reduce", tn, te, &st);
    }
    bench.finish()
}
