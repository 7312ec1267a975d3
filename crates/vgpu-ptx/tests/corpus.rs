//! Kernels compiled by nvcc (see corpus/build.sh) run on the executor and
//! are checked against references computed here; some also as compiled
//! for debugging (`-G`) and with fast math.

// References index like the kernels they check.
#![allow(clippy::needless_range_loop)]

use vgpu_ptx::{
    extract_ptx, launch, ExecError, GlobalMemory, LaunchConfig, Limits, Module, VecMemory,
};

const BASE: u64 = 0x7000_0000;

fn corpus(name: &str) -> Module {
    let path = format!("{}/tests/corpus/{name}.ptx", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap();
    Module::parse(&text).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// A bump allocator over one flat buffer.
struct Dev {
    mem: VecMemory,
    next: u64,
}

impl Dev {
    fn new(bytes: usize) -> Dev {
        Dev {
            mem: VecMemory::new(BASE, bytes),
            next: BASE,
        }
    }
    fn alloc(&mut self, bytes: usize) -> u64 {
        let a = self.next;
        self.next += (bytes as u64).div_ceil(256) * 256;
        assert!(self.next <= BASE + self.mem.len() as u64);
        a
    }
    fn put<T: Num>(&mut self, v: &[T]) -> u64 {
        let mut bytes = Vec::with_capacity(v.len() * T::SIZE);
        v.iter().for_each(|x| x.put(&mut bytes));
        let a = self.alloc(bytes.len());
        self.mem.write(a, &bytes).unwrap();
        a
    }
    fn get<T: Num>(&self, a: u64, n: usize) -> Vec<T> {
        let mut buf = vec![0u8; n * T::SIZE];
        self.mem.read(a, &mut buf).unwrap();
        buf.chunks(T::SIZE).map(T::get).collect()
    }
}

/// Numbers as their little-endian bytes.
trait Num: Copy {
    const SIZE: usize;
    fn put(self, out: &mut Vec<u8>);
    fn get(b: &[u8]) -> Self;
}

macro_rules! num {
    ($($t:ty),*) => {$(
        impl Num for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            fn put(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn get(b: &[u8]) -> Self {
                <$t>::from_le_bytes(b.try_into().unwrap())
            }
        }
    )*};
}
num!(u8, i32, u32, u64, i64, f32, f64);

/// Packs parameters at the offsets the kernel reports.
fn params(m: &Module, kernel: &str, vals: &[&[u8]]) -> Vec<u8> {
    let k = m.kernel(kernel).unwrap();
    assert_eq!(k.params.len(), vals.len());
    let mut buf = vec![0u8; k.param_bytes as usize];
    for (p, v) in k.params.iter().zip(vals) {
        assert_eq!(p.size as usize, v.len());
        buf[p.offset as usize..][..v.len()].copy_from_slice(v);
    }
    buf
}

fn cfg(grid: [u32; 3], block: [u32; 3], shared_dyn: u32) -> LaunchConfig {
    LaunchConfig {
        grid,
        block,
        shared_dyn,
        workers: 2,
    }
}

fn lcg(seed: &mut u64) -> u32 {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (*seed >> 33) as u32
}

#[test]
fn vector_add() {
    let m = corpus("vector_add");
    let n = 1000usize;
    let a: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
    let b: Vec<f32> = (0..n).map(|i| 3.0 - i as f32).collect();
    let mut d = Dev::new(1 << 20);
    let (pa, pb, pc) = (d.put(&a), d.put(&b), d.alloc(n * 4));
    let p = params(
        &m,
        "vector_add",
        &[
            &pa.to_le_bytes(),
            &pb.to_le_bytes(),
            &pc.to_le_bytes(),
            &(n as i32).to_le_bytes(),
        ],
    );
    let st = launch(
        &m,
        "vector_add",
        &cfg([4, 1, 1], [256, 1, 1], 0),
        &p,
        &d.mem,
        &Limits::default(),
    )
    .unwrap();
    assert_eq!(st.blocks, 4);
    let c: Vec<f32> = d.get(pc, n);
    for i in 0..n {
        assert_eq!(c[i], a[i] + b[i]);
    }
    // Nothing written past n.
    assert_eq!(d.get::<u32>(pc + n as u64 * 4, 24), vec![0; 24]);
}

#[test]
fn vector_add_from_fatbinaries() {
    for f in ["plain", "lz4", "zstd"] {
        let path = format!(
            "{}/tests/corpus/vector_add.{f}.fatbin",
            env!("CARGO_MANIFEST_DIR")
        );
        let img = std::fs::read(path).unwrap();
        let ptx = extract_ptx(&img).unwrap();
        assert_eq!(ptx.len(), 1, "{f}");
        let m = Module::parse(&ptx[0]).unwrap();
        assert!(m.kernel("vector_add").is_some(), "{f}");
        let on_disk = std::fs::read_to_string(format!(
            "{}/tests/corpus/vector_add.ptx",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap();
        assert!(ptx[0].contains(".entry vector_add"), "{f}");
        assert!(on_disk.contains(".entry vector_add"));
    }
    let path = format!(
        "{}/tests/corpus/vector_add.cubin-only.fatbin",
        env!("CARGO_MANIFEST_DIR")
    );
    let img = std::fs::read(path).unwrap();
    assert_eq!(extract_ptx(&img), Err(vgpu_ptx::FatbinError::NoPtx));
    // Every truncation is an error, never a panic.
    let path = format!(
        "{}/tests/corpus/vector_add.zstd.fatbin",
        env!("CARGO_MANIFEST_DIR")
    );
    let img = std::fs::read(path).unwrap();
    for n in 0..img.len() {
        let _ = extract_ptx(&img[..n]);
    }
}

#[test]
fn matmul_tiled() {
    matmul_tiled_in("matmul");
    matmul_tiled_in("matmul.fast");
}

fn matmul_tiled_in(file: &str) {
    let m = corpus(file);
    assert_eq!(m.kernel("matmul").unwrap().shared_static, 2048);
    for n in [16usize, 37, 64] {
        let mut s = 7u64;
        let a: Vec<f32> = (0..n * n)
            .map(|_| (lcg(&mut s) % 100) as f32 / 10.0 - 5.0)
            .collect();
        let b: Vec<f32> = (0..n * n)
            .map(|_| (lcg(&mut s) % 100) as f32 / 10.0 - 5.0)
            .collect();
        let mut d = Dev::new(1 << 20);
        let (pa, pb, pc) = (d.put(&a), d.put(&b), d.alloc(n * n * 4));
        let p = params(
            &m,
            "matmul",
            &[
                &pa.to_le_bytes(),
                &pb.to_le_bytes(),
                &pc.to_le_bytes(),
                &(n as i32).to_le_bytes(),
            ],
        );
        let g = n.div_ceil(16) as u32;
        launch(
            &m,
            "matmul",
            &cfg([g, g, 1], [16, 16, 1], 0),
            &p,
            &d.mem,
            &Limits::default(),
        )
        .unwrap();
        let c: Vec<f32> = d.get(pc, n * n);
        for i in 0..n {
            for j in 0..n {
                // Same order of fused operations as the kernel: exact.
                let mut acc = 0.0f32;
                for k in 0..n {
                    acc = a[i * n + k].mul_add(b[k * n + j], acc);
                }
                assert_eq!(c[i * n + j], acc, "n={n} ({i},{j})");
            }
        }
    }
}

#[test]
fn reduce_with_atomics() {
    let m = corpus("reduce_atomic");
    let n = 5000usize;
    let mut s = 1u64;
    let v: Vec<i32> = (0..n).map(|_| lcg(&mut s) as i32 >> 8).collect();
    let mut d = Dev::new(1 << 20);
    let pin = d.put(&v);
    let psum = d.put(&[0u64]);
    let pmax = d.put(&[i32::MIN]);
    let p = params(
        &m,
        "reduce_atomic",
        &[
            &pin.to_le_bytes(),
            &psum.to_le_bytes(),
            &pmax.to_le_bytes(),
            &(n as i32).to_le_bytes(),
        ],
    );
    for workers in [1, 2, 4] {
        d.mem.write(psum, &0u64.to_le_bytes()).unwrap();
        let c = LaunchConfig {
            workers,
            ..cfg([n.div_ceil(256) as u32, 1, 1], [256, 1, 1], 256 * 4)
        };
        launch(&m, "reduce_atomic", &c, &p, &d.mem, &Limits::default()).unwrap();
        let sum: i64 = v.iter().map(|&x| x as i64).sum();
        assert_eq!(d.get::<u64>(psum, 1)[0] as i64, sum);
        assert_eq!(d.get::<i32>(pmax, 1)[0], *v.iter().max().unwrap());
    }
}

#[test]
fn reduce_with_shuffles() {
    reduce_with_shuffles_in("reduce_shfl");
    reduce_with_shuffles_in("reduce_shfl.debug");
}

fn reduce_with_shuffles_in(file: &str) {
    let m = corpus(file);
    let n = 10_000usize;
    let v: Vec<f32> = (0..n).map(|i| (i % 17) as f32 * 0.25).collect();
    let mut d = Dev::new(1 << 20);
    let pin = d.put(&v);
    let pout = d.put(&[0f32]);
    let p = params(
        &m,
        "reduce_shfl",
        &[
            &pin.to_le_bytes(),
            &pout.to_le_bytes(),
            &(n as i32).to_le_bytes(),
        ],
    );
    launch(
        &m,
        "reduce_shfl",
        &cfg([8, 1, 1], [128, 1, 1], 0),
        &p,
        &d.mem,
        &Limits::default(),
    )
    .unwrap();
    // Quarters of small integers: every partial sum is exact.
    let sum: f32 = v.iter().sum();
    assert_eq!(d.get::<f32>(pout, 1)[0], sum);
}

#[test]
fn warp_votes_and_shuffles() {
    warp_votes_and_shuffles_in("reduce_shfl");
    warp_votes_and_shuffles_in("reduce_shfl.debug");
}

fn warp_votes_and_shuffles_in(file: &str) {
    let m = corpus(file);
    let n = 256usize;
    let mut s = 3u64;
    let mut v: Vec<i32> = (0..n).map(|_| (lcg(&mut s) % 21) as i32 - 3).collect();
    // One warp all positive, one all non-positive.
    v[32..64].iter_mut().for_each(|x| *x = x.abs() + 1);
    v[64..96].iter_mut().for_each(|x| *x = -x.abs());
    let mut d = Dev::new(1 << 20);
    let pin = d.put(&v);
    let pb = d.alloc((1024 + n) * 4);
    let pall = d.alloc(n / 32 * 4);
    let pany = d.alloc(n / 32 * 4);
    let p = params(
        &m,
        "warp_vote",
        &[
            &pin.to_le_bytes(),
            &pb.to_le_bytes(),
            &pall.to_le_bytes(),
            &pany.to_le_bytes(),
        ],
    );
    launch(
        &m,
        "warp_vote",
        &cfg([2, 1, 1], [128, 1, 1], 0),
        &p,
        &d.mem,
        &Limits::default(),
    )
    .unwrap();
    let ballot: Vec<u32> = d.get(pb, 1024 + n);
    let all: Vec<i32> = d.get(pall, n / 32);
    let any: Vec<i32> = d.get(pany, n / 32);
    for w in 0..n / 32 {
        let lanes = &v[w * 32..w * 32 + 32];
        let b = lanes
            .iter()
            .enumerate()
            .fold(0u32, |b, (l, &x)| b | ((x > 0) as u32) << l);
        assert_eq!(ballot[w], b, "warp {w}");
        assert_eq!(all[w] != 0, lanes.iter().all(|&x| x > 0));
        assert_eq!(any[w] != 0, lanes.iter().any(|&x| x > 0));
        for l in 0..32 {
            let x = lanes[l ^ 1];
            let u = if l >= 3 { lanes[l - 3] } else { lanes[l] };
            let ww = lanes[7];
            assert_eq!(
                ballot[1024 + w * 32 + l] as i32,
                x + 3 * u + 7 * ww,
                "warp {w} lane {l}"
            );
        }
    }
}

#[test]
fn scan_blocks() {
    let m = corpus("scan");
    let n = 1000usize;
    let bs = 256usize;
    let v: Vec<u32> = (0..n as u32).map(|i| i * 7 % 13).collect();
    let mut d = Dev::new(1 << 20);
    let pin = d.put(&v);
    let pout = d.alloc(n * 4);
    let p = params(
        &m,
        "scan",
        &[
            &pin.to_le_bytes(),
            &pout.to_le_bytes(),
            &(n as i32).to_le_bytes(),
        ],
    );
    launch(
        &m,
        "scan",
        &cfg(
            [n.div_ceil(bs) as u32, 1, 1],
            [bs as u32, 1, 1],
            2 * bs as u32 * 4,
        ),
        &p,
        &d.mem,
        &Limits::default(),
    )
    .unwrap();
    let out: Vec<u32> = d.get(pout, n);
    for blk in v.chunks(bs).enumerate() {
        let mut acc = 0;
        for (i, x) in blk.1.iter().enumerate() {
            acc += x;
            assert_eq!(out[blk.0 * bs + i], acc);
        }
    }
}

#[test]
fn histogram_shared_atomics() {
    let m = corpus("histogram");
    let n = 20_000usize;
    let mut s = 11u64;
    let data: Vec<u8> = (0..n).map(|_| (lcg(&mut s) % 251) as u8 ^ 0x5a).collect();
    let mut d = Dev::new(1 << 20);
    let pd = d.put(&data);
    let pb = d.put(&[0u32; 256]);
    let p = params(
        &m,
        "histogram",
        &[
            &pd.to_le_bytes(),
            &pb.to_le_bytes(),
            &(n as i32).to_le_bytes(),
        ],
    );
    let c = LaunchConfig {
        workers: 4,
        ..cfg([16, 1, 1], [192, 1, 1], 0)
    };
    launch(&m, "histogram", &c, &p, &d.mem, &Limits::default()).unwrap();
    let mut want = [0u32; 256];
    for &x in &data {
        want[x as usize] += 1;
    }
    assert_eq!(d.get::<u32>(pb, 256), want.to_vec());
}

#[test]
fn stencil_with_constants() {
    let m = corpus("stencil");
    let n = 1000usize;
    let v: Vec<f64> = (0..n).map(|i| ((i * 37) % 101) as f64 / 7.0).collect();
    let mut d = Dev::new(1 << 20);
    let pin = d.put(&v);
    let pout = d.alloc(n * 8);
    let p = params(
        &m,
        "stencil",
        &[
            &pin.to_le_bytes(),
            &pout.to_le_bytes(),
            &(n as i32).to_le_bytes(),
        ],
    );
    launch(
        &m,
        "stencil",
        &cfg([n.div_ceil(128) as u32, 1, 1], [128, 1, 1], 0),
        &p,
        &d.mem,
        &Limits::default(),
    )
    .unwrap();
    let w: [f64; 7] = [0.05, 0.1, 0.2, 0.3, 0.2, 0.1, 0.05];
    let out: Vec<f64> = d.get(pout, n);
    for g in 0..n {
        let mut acc = 0.0f64;
        for k in -3i64..=3 {
            let j = g as i64 + k;
            let x = if j >= 0 && (j as usize) < n {
                v[j as usize]
            } else {
                0.0
            };
            acc = w[(k + 3) as usize].mul_add(x, acc);
        }
        assert_eq!(out[g], acc, "{g}");
    }
}

#[test]
fn bitonic_sort() {
    let m = corpus("bitonic");
    let blocks = 3usize;
    let mut s = 5u64;
    let keys: Vec<i32> = (0..512 * blocks).map(|_| lcg(&mut s) as i32).collect();
    let mut d = Dev::new(1 << 20);
    let pk = d.put(&keys);
    let p = params(&m, "bitonic", &[&pk.to_le_bytes()]);
    launch(
        &m,
        "bitonic",
        &cfg([blocks as u32, 1, 1], [128, 1, 1], 0),
        &p,
        &d.mem,
        &Limits::default(),
    )
    .unwrap();
    let out: Vec<i32> = d.get(pk, 512 * blocks);
    for b in 0..blocks {
        let mut want = keys[b * 512..(b + 1) * 512].to_vec();
        want.sort();
        assert_eq!(&out[b * 512..(b + 1) * 512], &want[..], "block {b}");
    }
}

#[test]
fn divergent_loops_and_calls() {
    divergent_loops_and_calls_in("divergent");
    divergent_loops_and_calls_in("divergent.debug");
}

fn divergent_loops_and_calls_in(file: &str) {
    let m = corpus(file);
    let n = 300usize;
    let v: Vec<i32> = (0..n as i32).map(|i| (i * 7919) % 1000 - 100).collect();
    let mut d = Dev::new(1 << 20);
    let pin = d.put(&v);
    let (ps, pg, pf, pq) = (
        d.alloc(n * 4),
        d.alloc(n * 4),
        d.alloc(n * 4),
        d.alloc(n * 8),
    );
    let p = params(
        &m,
        "divergent",
        &[
            &pin.to_le_bytes(),
            &ps.to_le_bytes(),
            &pg.to_le_bytes(),
            &pf.to_le_bytes(),
            &pq.to_le_bytes(),
            &(n as i32).to_le_bytes(),
        ],
    );
    launch(
        &m,
        "divergent",
        &cfg([3, 1, 1], [128, 1, 1], 0),
        &p,
        &d.mem,
        &Limits::default(),
    )
    .unwrap();
    let steps: Vec<u32> = d.get(ps, n);
    let g: Vec<i32> = d.get(pg, n);
    let f: Vec<f32> = d.get(pf, n);
    let q: Vec<i64> = d.get(pq, n);
    for i in 0..n {
        let x0 = v[i];
        let mut x = x0.max(1) as u64;
        let mut st = 0;
        while x != 1 {
            x = if x & 1 == 1 { 3 * x + 1 } else { x / 2 };
            st += 1;
        }
        assert_eq!(steps[i], st, "collatz {i}");
        let (mut a, mut b) = (x0, 36 + (i as i32 % 7) * 6);
        while b != 0 {
            let t = a % b;
            a = b;
            b = t;
        }
        assert_eq!(g[i], a.abs(), "gcd {i}");
        let fv = if i & 1 == 1 {
            let mut acc = 0.0f32;
            for k in 0..(i % 5) {
                acc += (x0 as f32 + k as f32).sqrt() / (1.0 + k as f32);
            }
            acc
        } else {
            x0 as f32 * 0.5 - 1.0
        };
        let same = f[i] == fv || (f[i].is_nan() && fv.is_nan());
        assert!(same, "mix {i}: {} vs {fv}", f[i]);
        let r = if fv.is_nan() {
            0
        } else {
            fv.round_ties_even() as i32
        };
        assert_eq!(
            q[i],
            x0 as i64 * 1000003 / (i as i64 + 1) - (x0 >> 2) as i64 + r as i64,
            "q {i}"
        );
    }
}

#[test]
fn out_of_bounds_is_an_illegal_address() {
    let m = corpus("vector_add");
    let mut d = Dev::new(4096);
    let pa = d.alloc(1024);
    // n larger than the buffers: the kernel reads past the end.
    let p = params(
        &m,
        "vector_add",
        &[
            &pa.to_le_bytes(),
            &pa.to_le_bytes(),
            &pa.to_le_bytes(),
            &100_000i32.to_le_bytes(),
        ],
    );
    let e = launch(
        &m,
        "vector_add",
        &cfg([400, 1, 1], [256, 1, 1], 0),
        &p,
        &d.mem,
        &Limits::default(),
    )
    .unwrap_err();
    match e {
        ExecError::IllegalAddress { addr, size, .. } => {
            assert!(addr >= BASE + 4096, "{addr:#x}");
            assert_eq!(size, 4);
        }
        e => panic!("{e}"),
    }
}

#[test]
fn launch_shape_is_checked() {
    let m = corpus("scan");
    let d = Dev::new(4096);
    let p = vec![0u8; 20];
    let l = Limits {
        max_shared: 48 << 10,
        ..Limits::default()
    };
    let e = launch(
        &m,
        "scan",
        &cfg([1, 1, 1], [256, 1, 1], 64 << 10),
        &p,
        &d.mem,
        &l,
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            ExecError::SharedTooLarge {
                requested: 65536,
                max: 49152
            }
        ),
        "{e}"
    );
    let e = launch(&m, "scan", &cfg([1, 1, 1], [2048, 1, 1], 0), &p, &d.mem, &l).unwrap_err();
    assert!(matches!(e, ExecError::BadLaunch(_)), "{e}");
    let e = launch(&m, "scan", &cfg([0, 1, 1], [32, 1, 1], 0), &p, &d.mem, &l).unwrap_err();
    assert!(matches!(e, ExecError::BadLaunch(_)), "{e}");
    let e = launch(
        &m,
        "scan",
        &cfg([1, 1, 1], [32, 1, 1], 0),
        &p[..4],
        &d.mem,
        &l,
    )
    .unwrap_err();
    assert!(matches!(e, ExecError::BadLaunch(_)), "{e}");
    let e = launch(
        &m,
        "scan",
        &cfg([u32::MAX, 65535, 65535], [32, 1, 1], 0),
        &p,
        &d.mem,
        &l,
    )
    .unwrap_err();
    assert!(matches!(e, ExecError::BadLaunch(_)), "{e}");
    let e = launch(&m, "nope", &cfg([1, 1, 1], [32, 1, 1], 0), &p, &d.mem, &l).unwrap_err();
    assert_eq!(e, ExecError::NoKernel("nope".into()));
}

/// Distance in units in the last place (both NaN: 0).
fn ulps(a: f32, b: f32) -> u32 {
    if a.is_nan() && b.is_nan() {
        return 0;
    }
    let key = |x: f32| {
        let i = x.to_bits() as i32;
        if i < 0 {
            i32::MIN - i
        } else {
            i
        }
    };
    (key(a) as i64 - key(b) as i64)
        .unsigned_abs()
        .min(u32::MAX as u64) as u32
}

#[test]
fn library_math_and_intrinsics() {
    let m = corpus("math");
    let k = m.kernel("math").unwrap();
    assert_eq!(
        (k.params[4].offset, k.params[4].size, k.params[4].align),
        (32, 16, 8)
    );
    let mut s = 9u64;
    let mut x: Vec<f32> = (0..500)
        .map(|_| (lcg(&mut s) % 40_000) as f32 / 1000.0 - 20.0)
        .collect();
    x.extend([
        0.0, -0.0, 1e-3, -1e-3, 0.5, 1.0, -1.0, 3.0, 1e4, -1e4, 65504.0, 7e-5,
    ]);
    let n = x.len();
    let mut d = Dev::new(1 << 20);
    let px = d.put(&x);
    let (pf, pd, pu) = (d.alloc(n * 32), d.alloc(n * 16), d.alloc(n * 16));
    let (smul, sadd, sdmul) = (2.5f32, 12345i32, 0.25f64);
    let mut scale = Vec::new();
    scale.extend_from_slice(&smul.to_le_bytes());
    scale.extend_from_slice(&sadd.to_le_bytes());
    scale.extend_from_slice(&sdmul.to_le_bytes());
    let p = params(
        &m,
        "math",
        &[
            &px.to_le_bytes(),
            &pf.to_le_bytes(),
            &pd.to_le_bytes(),
            &pu.to_le_bytes(),
            &scale,
            &(n as i32).to_le_bytes(),
        ],
    );
    launch(
        &m,
        "math",
        &cfg([n.div_ceil(128) as u32, 1, 1], [128, 1, 1], 0),
        &p,
        &d.mem,
        &Limits::default(),
    )
    .unwrap();
    let f: Vec<f32> = d.get(pf, n * 8);
    let dd: Vec<f64> = d.get(pd, n * 2);
    let u: Vec<u32> = d.get(pu, n * 4);
    for (i, &v) in x.iter().enumerate() {
        // CUDA's documented maximum errors are 1-4 ulp; Rust's libm is
        // within 1 of the exact value.
        let refs = [
            (v.exp(), 4),
            ((v.abs() + 1.0).ln(), 3),
            (v.sin(), 3),
            (v.cos(), 3),
            (v.abs().powf(1.5), 6),
            (v.tanh(), 3),
            ((v * smul) % 3.0, 0),
        ];
        for (j, (want, tol)) in refs.iter().enumerate() {
            let got = f[8 * i + j];
            assert!(
                ulps(got, *want) <= *tol,
                "x={v} fn {j}: {got} vs {want} ({} ulp)",
                ulps(got, *want)
            );
        }
        // f16 round trip, round to nearest even.
        let h = f[8 * i + 7];
        let h_ref = if v.abs() >= 65520.0 {
            f32::INFINITY.copysign(v)
        } else {
            h
        };
        assert_eq!(h, h_ref);
        assert!((h - v).abs() <= v.abs() / 1024.0 + 6e-8, "f16 of {v}: {h}");
        let e = (v as f64).exp() * sdmul;
        assert!(
            dd[2 * i] == e || (dd[2 * i] - e).abs() <= e.abs() * 4e-16,
            "exp({v}) = {}, want {e}",
            dd[2 * i]
        );
        assert_eq!(dd[2 * i + 1], (v as f64).abs().sqrt());
        let b = v.to_bits().wrapping_add(sadd as u32);
        assert_eq!(
            u[4 * i],
            b.count_ones().wrapping_add(b.reverse_bits() << 8),
            "popc/brev {v}"
        );
        let ffs = if b == 0 { 0 } else { b.trailing_zeros() + 1 };
        assert_eq!(u[4 * i + 1], ffs + 64 * b.leading_zeros(), "ffs/clz {v}");
        let bytes = (b as u64) | (0x0102_0304u64 << 32);
        let perm = (0..4).fold(0u32, |r, k| {
            r | ((bytes >> (((0x5140u32 >> (4 * k)) & 7) * 8)) as u32 & 0xff) << (8 * k)
        });
        assert_eq!(u[4 * i + 2], perm, "byte_perm {v}");
        let sh = (i & 31) as u32;
        let fs = ((((!b as u64) << 32) | b as u64) << sh >> 32) as u32;
        assert_eq!(u[4 * i + 3], fs, "funnelshift {v}");
    }
}

#[test]
fn cub_block_radix_sort() {
    let m = corpus("cub");
    // Three full tiles of 2048 and a partial one.
    let n = 3 * 2048 + 1000usize;
    let mut s = 9u64;
    let keys: Vec<i32> = (0..n).map(|_| lcg(&mut s) as i32).collect();
    let mut d = Dev::new(1 << 20);
    let pk = d.put(&keys);
    let p = params(
        &m,
        "cub_block_sort",
        &[&pk.to_le_bytes(), &(n as i32).to_le_bytes()],
    );
    launch(
        &m,
        "cub_block_sort",
        &cfg([n.div_ceil(2048) as u32, 1, 1], [128, 1, 1], 0),
        &p,
        &d.mem,
        &Limits::default(),
    )
    .unwrap();
    let got = d.get::<i32>(pk, n);
    for (t, tile) in keys.chunks(2048).enumerate() {
        let mut want = tile.to_vec();
        want.sort_unstable();
        assert_eq!(&got[t * 2048..t * 2048 + tile.len()], &want[..], "tile {t}");
    }
}

#[test]
fn cub_block_reduce() {
    let m = corpus("cub");
    let n = 100_000usize;
    let mut s = 5u64;
    let v: Vec<i32> = (0..n).map(|_| (lcg(&mut s) % 2001) as i32 - 1000).collect();
    let mut d = Dev::new(1 << 20);
    let pin = d.put(&v);
    let pout = d.put(&[0u64]);
    let p = params(
        &m,
        "cub_block_reduce",
        &[
            &pin.to_le_bytes(),
            &pout.to_le_bytes(),
            &(n as i32).to_le_bytes(),
        ],
    );
    launch(
        &m,
        "cub_block_reduce",
        &cfg([40, 1, 1], [256, 1, 1], 0),
        &p,
        &d.mem,
        &Limits::default(),
    )
    .unwrap();
    let want: i64 = v.iter().map(|&x| x as i64).sum();
    assert_eq!(d.get::<u64>(pout, 1)[0] as i64, want);
}

#[test]
fn block_votes_reduce_predicates() {
    let m = corpus("cub");
    let (blocks, threads) = (6usize, 96usize);
    let mut s = 3u64;
    let mut v: Vec<i32> = (0..blocks * threads)
        .map(|_| (lcg(&mut s) % 201) as i32 - 100)
        .collect();
    // Block 1 holds a 7; block 2 nothing at or below -100.
    v[threads + 5] = 7;
    for x in &mut v[2 * threads..3 * threads] {
        *x = (*x).max(-99);
    }
    let mut d = Dev::new(1 << 20);
    let pin = d.put(&v);
    let pout = d.put(&vec![-1i32; 3 * blocks]);
    let p = params(
        &m,
        "block_votes",
        &[&pin.to_le_bytes(), &pout.to_le_bytes()],
    );
    launch(
        &m,
        "block_votes",
        &cfg([blocks as u32, 1, 1], [threads as u32, 1, 1], 0),
        &p,
        &d.mem,
        &Limits::default(),
    )
    .unwrap();
    let got = d.get::<i32>(pout, 3 * blocks);
    for (b, blk) in v.chunks(threads).enumerate() {
        let count = blk.iter().filter(|&&x| x > 0).count() as i32;
        let all = blk.iter().all(|&x| x > -100) as i32;
        let any = blk.contains(&7) as i32;
        assert_eq!(&got[3 * b..3 * b + 3], &[count, all, any], "block {b}");
    }
    assert_eq!(got[3 * 2 + 1], 1);
    assert_eq!(got[3 + 2], 1);
}

#[test]
fn grid_sync_of_a_cooperative_launch() {
    let m = corpus("grid_sync");
    let (blocks, threads) = (6usize, 64usize);
    let n = blocks * threads;
    let mut d = Dev::new(1 << 20);
    let zeros = vec![0i32; n];
    let (pa, pb, pc) = (d.put(&zeros), d.put(&zeros), d.put(&zeros));
    let work = d.put(&[0u64]);
    let p = params(
        &m,
        "grid_rotate",
        &[&pa.to_le_bytes(), &pb.to_le_bytes(), &pc.to_le_bytes()],
    );
    let c = LaunchConfig {
        workers: blocks,
        ..cfg([blocks as u32, 1, 1], [threads as u32, 1, 1], 0)
    };
    let lim = Limits {
        grid_sync: Some(work),
        max_steps: Some(50_000_000),
        ..Limits::default()
    };
    // Twice: the workspace counts on from where the first grid left it.
    for _ in 0..2 {
        d.mem.write(pc, &vec![0u8; n * 4]).unwrap();
        launch(&m, "grid_rotate", &c, &p, &d.mem, &lim).unwrap();
        let got = d.get::<i32>(pc, n);
        for i in 0..n {
            // Two blocks ahead of i, as block i's neighbour read it.
            let j = (i + 2 * threads) % n;
            assert_eq!(got[i], (j * 3 + 1) as i32 + 1000, "thread {i}");
        }
    }
    // More blocks than can run at once: refused, not a deadlock.
    let small = LaunchConfig { workers: 4, ..c };
    let e = launch(&m, "grid_rotate", &small, &p, &d.mem, &lim);
    assert!(matches!(e, Err(ExecError::BadLaunch(_))), "{e:?}");
    // Outside a cooperative launch the grid has no workspace: cooperative
    // groups trap.
    let e = launch(&m, "grid_rotate", &c, &p, &d.mem, &Limits::default());
    assert!(matches!(e, Err(ExecError::Trap(_))), "{e:?}");
}

/// Two kernels of one module, each with a `.shared` array of 40 KiB: as
/// on a GPU, each has its own 40 KiB under a 48 KiB limit (the module's
/// one layout places the second after the first), and the second's
/// array holds what its threads put there.
#[test]
fn each_kernel_counts_only_its_own_shared_variables() {
    let ptx = ".version 8.5\n.target sm_90\n.address_size 64\n\
        .shared .align 4 .b8 first[40960];\n.shared .align 4 .b8 second[40960];\n\
        .visible .entry k1(.param .u64 out)\n{\n.reg .b32 %r<4>;\n.reg .b64 %rd<4>;\n\
        mov.u32 %r1, %tid.x;\nshl.b32 %r2, %r1, 2;\nmov.u32 %r3, first;\nadd.u32 %r2, %r2, %r3;\n\
        st.shared.u32 [%r2], %r1;\nret;\n}\n\
        .visible .entry k2(.param .u64 out)\n{\n.reg .b32 %r<6>;\n.reg .b64 %rd<4>;\n\
        ld.param.u64 %rd1, [out];\ncvta.to.global.u64 %rd1, %rd1;\n\
        mov.u32 %r1, %tid.x;\nshl.b32 %r2, %r1, 2;\nmov.u32 %r3, second;\nadd.u32 %r4, %r2, %r3;\n\
        add.u32 %r5, %r1, 7;\nst.shared.u32 [%r4], %r5;\nbar.sync 0;\n\
        xor.b32 %r5, %r1, 1;\nshl.b32 %r5, %r5, 2;\nadd.u32 %r5, %r5, %r3;\nld.shared.u32 %r5, [%r5];\n\
        mul.wide.u32 %rd2, %r1, 4;\nadd.s64 %rd3, %rd1, %rd2;\nst.global.u32 [%rd3], %r5;\nret;\n}\n";
    let m = Module::parse(ptx).unwrap();
    for k in ["k1", "k2"] {
        assert_eq!(m.kernel(k).unwrap().shared_static, 40960, "{k}");
    }
    let l = Limits {
        max_shared: 48 << 10,
        ..Limits::default()
    };
    let mut d = Dev::new(4096);
    let out = d.alloc(64 * 4);
    let p = params(&m, "k2", &[&out.to_le_bytes()]);
    launch(&m, "k2", &cfg([1, 1, 1], [64, 1, 1], 0), &p, &d.mem, &l).unwrap();
    let want: Vec<u32> = (0..64u32).map(|t| (t ^ 1) + 7).collect();
    assert_eq!(d.get::<u32>(out, 64), want);
    // Its own 40 KiB with 12 KiB more of dynamic memory is past the limit.
    let e = launch(
        &m,
        "k2",
        &cfg([1, 1, 1], [64, 1, 1], 12 << 10),
        &p,
        &d.mem,
        &l,
    )
    .unwrap_err();
    assert!(matches!(e, ExecError::SharedTooLarge { .. }), "{e}");
}
