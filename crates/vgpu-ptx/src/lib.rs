//! A PTX front end and a CPU executor: what the software backend needs to
//! run the CUDA kernels a guest loads.
//!
//! - [`fatbin::extract_ptx`] finds the PTX in a module image (a CUDA
//!   fatbinary, its entries stored plain, LZ4 or Zstd compressed, or PTX
//!   text). Cubins (machine code) are skipped: a CPU cannot run them.
//! - [`Module::parse`] decodes PTX text once into a compact instruction
//!   form (registers as indices, typed operations, resolved labels and
//!   variables) and reports each kernel's launch metadata
//!   ([`Module::kernel`]: parameter offsets, sizes and alignments, static
//!   shared memory, local memory, a register estimate).
//! - [`exec::launch`] runs a kernel over a grid on `workers` OS threads
//!   against a [`GlobalMemory`] that checks every device access.
//!
//! ```
//! use vgpu_ptx::{launch, GlobalMemory, LaunchConfig, Limits, Module, VecMemory};
//!
//! let ptx = r#"
//! .version 8.5
//! .target sm_90
//! .address_size 64
//! .visible .entry twice(.param .u64 p)
//! {
//!     .reg .b32 %r<4>;
//!     .reg .b64 %rd<4>;
//!     ld.param.u64 %rd1, [p];
//!     mov.u32 %r1, %tid.x;
//!     mul.wide.u32 %rd2, %r1, 4;
//!     add.s64 %rd3, %rd1, %rd2;
//!     ld.global.u32 %r2, [%rd3];
//!     shl.b32 %r3, %r2, 1;
//!     st.global.u32 [%rd3], %r3;
//!     ret;
//! }
//! "#;
//! let module = Module::parse(ptx)?;
//! let info = module.kernel("twice").unwrap();
//! assert_eq!(info.param_bytes, 8);
//! let mem = VecMemory::new(0x1000, 64 * 4);
//! for i in 0..64u32 {
//!     mem.write(0x1000 + 4 * i as u64, &i.to_le_bytes()).unwrap();
//! }
//! let cfg = LaunchConfig { grid: [1, 1, 1], block: [64, 1, 1], shared_dyn: 0, workers: 1 };
//! launch(&module, "twice", &cfg, &0x1000u64.to_le_bytes(), &mem, &Limits::default())?;
//! let mut out = [0u8; 4];
//! mem.read(0x1000 + 4 * 21, &mut out).unwrap();
//! assert_eq!(u32::from_le_bytes(out), 42);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Execution model
//! A warp's 32 lanes execute each instruction together, registers stored
//! per warp as rows of 32 lanes. Lanes have their own program counters;
//! the warp runs the lanes at the lowest one, so divergent branches
//! reconverge where the paths join; warp-collective instructions
//! (`shfl.sync`, `vote.sync`, ...) wait for lanes that are elsewhere. A
//! block's warps take turns at barriers and every few thousand
//! instructions, so a warp spinning on a flag another warp sets makes
//! progress (lanes of one warp spinning on each other do not: the lowest
//! PC keeps running until the step limit or deadline stops it).
//! `bar.sync` waits for every thread of the block; threads that have
//! exited count as arrived. Shared memory is
//! per block (static variables first, then dynamic shared memory where
//! every `extern .shared` array starts), local memory per thread.
//!
//! Generic addresses: device memory is used as is; shared memory appears
//! at [`ir::SHARED_WINDOW`], the thread's local memory at
//! [`ir::LOCAL_WINDOW`] and the module's `.global`/`.const` variables at
//! [`ir::STATIC_WINDOW`] (device allocations must lie below it).
//!
//! # Supported
//! What `nvcc` 12.9/13.x emits for ordinary kernels: `.version`,
//! `.target`, `.address_size 64`; `.entry`/`.func` (with return values,
//! `.visible`/`.weak`/`.extern`, performance directives);
//! `.reg` (with `<N>` ranges), `.shared`, `.global`, `.const`, `.local`
//! and `.param` variables with alignment, arrays and initialisers;
//! predicates and `@!p`; labels; `call` of a `.func`; vector operands;
//! `.pragma`, comments, `.loc`/`.file` (ignored).
//!
//! Instructions: `mov` (also packing and unpacking vectors), `ld`/`ldu`/
//! `st` in every state space (`.nc`, `.v2`/`.v4`, cache and ordering
//! qualifiers accepted), `cvta`, `add`/`sub` (`.sat` for integers),
//! `mul` (`.lo/.hi/.wide`), `mad` (`.lo/.hi/.wide`), carry chains
//! (`add.cc`, `addc`, `sub.cc`, `subc`, `mad.cc`, `madc`), `fma`, `mul24`/
//! `mad24`, `div`, `rem`, `min`, `max`, `abs`, `neg`, `and`/`or`/`xor`/
//! `not`/`cnot`, `shl`/`shr`, `shf`, `setp` (every comparison including
//! the unordered ones, `.and/.or/.xor`, two destinations), `selp`, `cvt`
//! between every integer and float type (f16 and bf16 included) with
//! integer rounding (`.rni .rzi .rmi .rpi`), `.sat` and `.ftz`, `bra`,
//! `call`, `ret`, `exit`, `trap`, special registers (`%tid`, `%ntid`,
//! `%ctaid`, `%nctaid`, `%laneid`, `%warpid`, `%nwarpid`, `%lanemask_*`,
//! `%clock`, `%clock64`, `%globaltimer`, `%dynamic_smem_size`, ...;
//! `%envreg0`..`%envreg31`: zero, but for a cooperative launch's grid
//! workspace, [`Limits::grid_sync`], with which cooperative groups'
//! `grid.sync()` works; `%reserved_smem_offset_*`: 1 KiB of the block's
//! shared memory outside the kernel's, where cooperative groups keep the
//! state of tiles of several warps),
//! `atom`/`red` (add, min, max, exch, cas, and, or, xor, inc, dec; 32-
//! and 64-bit integers, f32 and f64 add) on global, shared and generic
//! addresses, `shfl.sync` (up, down, bfly, idx, with the predicate
//! output), `vote.sync` (all, any, uni, ballot), `redux.sync`,
//! `match.any/all.sync`, `elect.sync`, `activemask`, `isspacep`,
//! `bar.sync`/`barrier.sync`, `bar.red`/`barrier.cta.red` (`.popc.u32`,
//! `.and.pred`, `.or.pred`), `membar`/`fence` (no-ops: a block runs on
//! one thread and device memory is accessed with atomics), `rcp`,
//! `sqrt`, `rsqrt`, `ex2`, `lg2`, `sin`, `cos`, `tanh`, `popc`, `clz`,
//! `brev`, `bfind`, `bfe`, `bfi`, `bmsk` (`.clamp`, `.wrap`), `prmt`
//! (default mode), `lop3`, `copysign`, `testp`. Half precision, scalar
//! and packed (`.f16`, `.bf16`, `.f16x2`, `.bf16x2`): `add`, `sub`,
//! `mul`, `fma` (`.rn`, `.ftz`, `.sat`, `.relu`; rounded once, as the
//! hardware does), `min`, `max` (`.relu`), `neg`, `abs`,
//! `cvt.rn{.relu}.f16x2.f32` / `.bf16x2.f32`, `set` (every type pair,
//! half pairs too) and `atom`/`red.add.noftz` of `.f16x2`/`.bf16x2`. Calls of the runtime's `vprintf` (device
//! `printf`) are formatted as C's `printf` does, each lane's text handed
//! to [`Limits::print`] (a [`PrintSink`]) and the call returns what CUDA's
//! does: the number of arguments, -1 for an unreadable format, -2 for
//! unreadable arguments (see [`printf`]); `__assertfail` ends the launch
//! like `trap`. Texture and surface objects ([`texture`]: a handle is the
//! device address of a descriptor the backend wrote): `tex` of `.1d`,
//! `.2d`, `.3d`, `.a1d`, `.a2d`, `.cube`, `.acube` with `.v4` results of `.f32`, `.s32` or
//! `.u32` at `.f32` or `.s32` coordinates (point and linear filtering,
//! normalised coordinates, wrap, clamp, mirror and border, 8-, 16- and
//! 32-bit integer, half and float elements of 1, 2 or 4 channels, read
//! as elements or normalised floats), `suld.b` and `sust.b` (`.b8` to
//! `.b64`, `.v2`, `.v4`; `.trap`, `.clamp`, `.zero`) of the same
//! geometries, `txq` and `suq` (width, height, depth, array size, ...);
//! a handle that names no descriptor is an illegal address.
//!
//! # Not supported (a parse or launch error, never a wrong answer where
//! it can be detected)
//! Valid PTX that the executor does not run does not fail the module: the
//! kernels that may reach such an instruction (themselves or through the
//! functions they call) fail to launch with [`ExecError::Refused`], which
//! names the instruction and its line ([`Module::refusals`],
//! [`Module::refused`]); the module's other kernels run. Malformed PTX
//! fails [`Module::parse`], as the driver's compiler refuses it.
//! - `brx.idx`, indirect calls, recursion and calls of other undefined
//!   functions such as `malloc` (refused at run time), texture and
//!   surface references (objects run), `tld4`, `sured`, `suld.p`,
//!   mipmapped textures (`.level`, `.grad`),
//!   `bar.arrive`, other packed types and operations (`ex2`,
//!   `setp`, `cvt` of `f16x2`; `u16x2`, `f32x2`; 16-bit atomics), `prmt`
//!   modes, `mad24.hi`, `min/max.NaN`, `dp4a`, `sad`, `wmma`/`mma`,
//!   `ldmatrix`, `cp.async`, `mbarrier`, clusters, `.callprototype`.
//! - Directed rounding (`.rz .rm .rp`) is exact for `add`, `sub`, `mul`,
//!   `div`, `sqrt`, `rcp` (f32 and f64), `fma.f32`, int-to-float `cvt` and
//!   f64-to-f32 `cvt`; elsewhere (`fma.f64`, other operations) the
//!   kernels that use it are refused. Float-to-f16
//!   `cvt` rounds to nearest. `.ftz` and `.sat` are honoured on float
//!   arithmetic and `cvt`. The `.approx` functions (`ex2`, `lg2`, `sin`,
//!   `cos`, `rsqrt`, `tanh`) are computed in double precision and rounded,
//!   well within their documented error.
//! - Named barriers with thread counts behave as whole-block barriers.
//! - `.global` and `.const` variables of a module live for one launch
//!   (initialised from the module each time) unless [`Limits::statics`]
//!   gives them a home in device memory ([`Module::statics`],
//!   [`Module::variable`]), as the software backend does. `.shared`
//!   variables have one layout for
//!   the whole module; a kernel's static shared memory ends with the last
//!   one it (or a function it calls) names, so in a module of several
//!   kernels it may count variables of others laid out before its own.

#![warn(missing_docs)]

pub mod exec;
pub mod fatbin;
pub mod half;
pub mod ir;
pub mod mem;
pub mod module;
pub mod parse;
pub mod printf;
pub mod texture;

pub use exec::{launch, ExecError, LaunchConfig, LaunchStats, Limits};
pub use fatbin::{
    cubin_function_names, cubin_len, extract_ptx, fatbin_len, function_names, is_cubin, FatbinError,
};
pub use mem::{AtomKind, AtomTy, AtomicOp, Fault, GlobalMemory, VecMemory, WordMemory};
pub use module::ParseError;
pub use module::{KernelInfo, Module, ParamInfo};
pub use printf::PrintSink;
