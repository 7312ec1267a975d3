//! The decoded instruction form the executor runs: registers resolved to
//! indices, types and modifiers resolved to enums, labels to instruction
//! indices, variables to offsets in their state space.

use crate::mem::AtomicOp;

/// Generic addresses of shared memory: `SHARED_WINDOW + offset` (what
/// `cvta.shared` gives). The backend's allocations must stay below
/// [`STATIC_WINDOW`].
pub const SHARED_WINDOW: u64 = 0xFFFF_F000_0000_0000;
/// Generic addresses of the running thread's local memory.
pub const LOCAL_WINDOW: u64 = 0xFFFF_E000_0000_0000;
/// Addresses of a module's `.global` and `.const` variables.
pub const STATIC_WINDOW: u64 = 0xFFFF_D000_0000_0000;
/// Size of each window.
pub const WINDOW_SIZE: u64 = 1 << 40;

/// Shared-space address of dynamic shared memory (where `extern .shared`
/// arrays start): the executor maps it after the static variables. It
/// fits 32 bits, as kernels keep shared addresses in 32-bit registers.
pub(crate) const EXTERN_SHARED: i64 = 1 << 31;

/// A PTX scalar type.
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ty {
    B8,
    B16,
    B32,
    B64,
    U8,
    U16,
    U32,
    U64,
    S8,
    S16,
    S32,
    S64,
    F16,
    Bf16,
    F32,
    F64,
    Pred,
}

impl Ty {
    /// Parses a type suffix (without the dot).
    pub fn from_name(s: &str) -> Option<Ty> {
        Some(match s {
            "b8" => Ty::B8,
            "b16" => Ty::B16,
            "b32" => Ty::B32,
            "b64" => Ty::B64,
            "u8" => Ty::U8,
            "u16" => Ty::U16,
            "u32" => Ty::U32,
            "u64" => Ty::U64,
            "s8" => Ty::S8,
            "s16" => Ty::S16,
            "s32" => Ty::S32,
            "s64" => Ty::S64,
            "f16" => Ty::F16,
            "bf16" => Ty::Bf16,
            "f32" => Ty::F32,
            "f64" => Ty::F64,
            "pred" => Ty::Pred,
            _ => return None,
        })
    }
    /// Width in bits (1 for predicates).
    pub fn bits(self) -> u32 {
        match self {
            Ty::Pred => 1,
            Ty::B8 | Ty::U8 | Ty::S8 => 8,
            Ty::B16 | Ty::U16 | Ty::S16 | Ty::F16 | Ty::Bf16 => 16,
            Ty::B32 | Ty::U32 | Ty::S32 | Ty::F32 => 32,
            Ty::B64 | Ty::U64 | Ty::S64 | Ty::F64 => 64,
        }
    }
    /// Size in bytes in memory (predicates take one byte).
    pub fn bytes(self) -> u32 {
        self.bits().div_ceil(8)
    }
    /// Signed integer.
    pub fn signed(self) -> bool {
        matches!(self, Ty::S8 | Ty::S16 | Ty::S32 | Ty::S64)
    }
    /// Floating point.
    pub fn float(self) -> bool {
        matches!(self, Ty::F16 | Ty::Bf16 | Ty::F32 | Ty::F64)
    }
}

/// A special register.
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sreg {
    Tid(u8),
    Ntid(u8),
    Ctaid(u8),
    Nctaid(u8),
    LaneId,
    WarpId,
    NWarpId,
    SmId,
    NSmId,
    GridId,
    Clock,
    Clock64,
    GlobalTimer,
    LaneMaskEq,
    LaneMaskLt,
    LaneMaskLe,
    LaneMaskGt,
    LaneMaskGe,
    DynSmem,
    TotalSmem,
    /// `%reserved_smem_offset_begin`, `_end`, `_cap` and `_0`/`_1`: the
    /// block's reserved shared memory.
    ReservedBegin,
    ReservedEnd,
    ReservedCap,
    Reserved(u8),
    /// `%envreg0`..`%envreg31`: set by the driver; zero here.
    EnvReg(u8),
}

/// A source operand.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Src {
    /// A register, by index.
    Reg(u32),
    /// An immediate (raw bits of the instruction's type).
    Imm(u64),
    /// A special register.
    Sreg(Sreg),
}

/// A state space.
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Space {
    Generic,
    Global,
    Shared,
    Local,
    Const,
    /// Kernel parameters (an `.entry`'s `.param`s).
    KParam,
    /// Per-thread parameter space of `.func` calls.
    Param,
}

/// An address operand: `[base + off]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Addr {
    /// The register holding the base, if any.
    pub base: Option<u32>,
    /// The constant part (a variable's address plus the offset).
    pub off: i64,
}

/// Two-operand operations.
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinOp {
    Add,
    Sub,
    AddSat,
    SubSat,
    MulLo,
    MulHi,
    Mul24Lo,
    Mul24Hi,
    Div,
    Rem,
    Min,
    Max,
    And,
    Or,
    Xor,
    Shl,
    Shr,
    Copysign,
}

/// One-operand operations.
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnOp {
    Mov,
    Not,
    Cnot,
    Neg,
    Abs,
    Popc,
    Clz,
    Brev,
    Rcp,
    Sqrt,
    Rsqrt,
    Ex2,
    Lg2,
    Sin,
    Cos,
    Tanh,
    /// Position of the most significant non-sign bit (all ones if none).
    Bfind,
    /// `bfind.shiftamt`: the shift that brings that bit to the top.
    BfindShift,
}

/// Operations that read or write the carry flag (`add.cc`, `addc`, ...).
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CarryOp {
    Add,
    Sub,
    /// `mad.lo` / `mad.hi` with the carry of the addition.
    MadLo,
    MadHi,
}

/// The register holding each lane's carry flag (`CC.CF`).
pub const CARRY_REG: u32 = 1;

/// Three-operand multiply-adds.
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MadOp {
    Lo,
    Hi,
    /// Source width, double-width result.
    Wide,
    /// Float fused multiply-add.
    Fma,
    Mad24Lo,
}

/// `setp` comparisons.
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cmp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    Lo,
    Ls,
    Hi,
    Hs,
    Equ,
    Neu,
    Ltu,
    Leu,
    Gtu,
    Geu,
    Num,
    Nan,
}

/// How `setp` combines with a third predicate.
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BoolOp {
    And,
    Or,
    Xor,
}

/// Rounding of `cvt` and friends.
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rnd {
    /// No rounding modifier: the type pair's default.
    Default,
    Rn,
    Rz,
    Rm,
    Rp,
    Rni,
    Rzi,
    Rmi,
    Rpi,
}

/// `shfl.sync` modes.
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShflMode {
    Up,
    Down,
    Bfly,
    Idx,
}

/// `vote.sync` modes.
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VoteMode {
    All,
    Any,
    Uni,
    Ballot,
}

/// `testp` properties.
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TestOp {
    Finite,
    Infinite,
    Number,
    NotANumber,
    Normal,
    Subnormal,
}

/// The operation of a float instruction with modifiers that the fast
/// paths do not handle (directed rounding, `.ftz`, `.sat`).
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FxOp {
    Bin(BinOp),
    Un(UnOp),
    Fma,
}

/// The reduction of `bar.red` / `barrier.cta.red`.
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BarRedOp {
    /// `.popc.u32`: how many threads' predicates are true.
    Popc,
    /// `.and.pred`: whether every thread's is.
    And,
    /// `.or.pred`: whether any thread's is.
    Or,
}

pub use crate::half::HalfOp;

/// One decoded instruction.
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    Un {
        op: UnOp,
        ty: Ty,
        d: u32,
        a: Src,
    },
    Bin {
        op: BinOp,
        ty: Ty,
        d: u32,
        a: Src,
        b: Src,
    },
    /// A float operation with rounding toward zero, minus or plus
    /// infinity (`rnd`), flushing of subnormals (`ftz`) or saturation to
    /// [0, 1] (`sat`).
    Fx {
        op: FxOp,
        ty: Ty,
        rnd: Rnd,
        ftz: bool,
        sat: bool,
        d: u32,
        a: Src,
        b: Src,
        c: Src,
    },
    /// `mul.wide`: `ty` is the source type.
    MulWide {
        ty: Ty,
        d: u32,
        a: Src,
        b: Src,
    },
    Mad {
        op: MadOp,
        ty: Ty,
        d: u32,
        a: Src,
        b: Src,
        c: Src,
    },
    Setp {
        cmp: Cmp,
        ty: Ty,
        d: Option<u32>,
        d2: Option<u32>,
        a: Src,
        b: Src,
        comb: Option<(BoolOp, Src, bool)>,
    },
    Selp {
        ty: Ty,
        d: u32,
        a: Src,
        b: Src,
        c: Src,
    },
    Cvt {
        dty: Ty,
        sty: Ty,
        rnd: Rnd,
        sat: bool,
        ftz: bool,
        dbits: u32,
        d: u32,
        a: Src,
    },
    /// `cvta`: `to` converts generic to the space, otherwise the reverse.
    Cvta {
        to: bool,
        space: Space,
        d: u32,
        a: Src,
    },
    /// A load; `dbits` is the destination registers' width (narrow signed
    /// loads sign-extend to it).
    Ld {
        space: Space,
        ty: Ty,
        n: u8,
        d: [u32; 4],
        dbits: u32,
        addr: Addr,
    },
    St {
        space: Space,
        ty: Ty,
        n: u8,
        v: [Src; 4],
        addr: Addr,
    },
    Atom {
        space: Space,
        op: AtomicOp,
        d: Option<u32>,
        addr: Addr,
        b: Src,
        c: Src,
    },
    Shfl {
        mode: ShflMode,
        d: u32,
        dp: Option<u32>,
        a: Src,
        b: Src,
        c: Src,
    },
    Vote {
        mode: VoteMode,
        d: u32,
        a: Src,
        neg: bool,
    },
    Bfe {
        ty: Ty,
        d: u32,
        a: Src,
        b: Src,
        c: Src,
    },
    Bfi {
        ty: Ty,
        d: u32,
        a: Src,
        b: Src,
        c: Src,
        e: Src,
    },
    Prmt {
        d: u32,
        a: Src,
        b: Src,
        c: Src,
    },
    Lop3 {
        d: u32,
        a: Src,
        b: Src,
        c: Src,
        lut: u8,
    },
    Testp {
        op: TestOp,
        ty: Ty,
        d: u32,
        a: Src,
    },
    /// `mov` of a vector into a wider register: parts from least significant.
    Pack {
        bits: u32,
        d: u32,
        parts: Vec<Src>,
    },
    /// `mov` of a wide register into a vector.
    Unpack {
        bits: u32,
        d: Vec<Option<u32>>,
        a: Src,
    },
    /// `add.cc`, `addc{.cc}`, `sub.cc`, `subc{.cc}`, `mad{c}.lo/hi{.cc}`.
    Carry {
        op: CarryOp,
        ty: Ty,
        cin: bool,
        cout: bool,
        d: u32,
        a: Src,
        b: Src,
        c: Src,
    },
    /// `redux.sync`: `op` over the active lanes.
    Redux {
        op: BinOp,
        ty: Ty,
        d: u32,
        a: Src,
    },
    /// `match.any.sync` / `match.all.sync`.
    Match {
        all: bool,
        bits: u32,
        d: u32,
        dp: Option<u32>,
        a: Src,
    },
    /// `elect.sync`: the lowest active lane.
    Elect {
        d: u32,
        dp: Option<u32>,
    },
    /// `isspacep`: whether a generic address is in the space.
    Isspacep {
        space: Space,
        d: u32,
        a: Src,
    },
    Activemask {
        d: u32,
    },
    Bra {
        target: u32,
    },
    Call {
        func: u32,
        args: Vec<u32>,
        ret: Option<u32>,
    },
    Ret,
    Exit,
    Bar,
    /// `shf.l`/`shf.r`: funnel shift of `b:a` by `c`.
    Shf {
        left: bool,
        wrap: bool,
        d: u32,
        a: Src,
        b: Src,
        c: Src,
    },
    Trap,
    Nop,
    /// `bar.red`: a barrier that also reduces each thread's predicate `c`
    /// (negated if `neg`) over the block into `d`.
    BarRed {
        op: BarRedOp,
        d: u32,
        c: Src,
        neg: bool,
    },
    /// `bmsk`: `b` bits set from bit `a` (`clamp` or `wrap` of
    /// positions and widths past 31).
    Bmsk {
        clamp: bool,
        d: u32,
        a: Src,
        b: Src,
    },
    /// Half-precision arithmetic on `lanes` (1, or 2 packed in 32 bits)
    /// values of `ty` (`F16` or `Bf16`), rounded to nearest once, with
    /// subnormals flushed (`ftz`), results clamped to [0, 1] (`sat`) or
    /// negative results to zero (`relu`).
    Half {
        op: HalfOp,
        ty: Ty,
        lanes: u8,
        ftz: bool,
        sat: bool,
        relu: bool,
        d: u32,
        a: Src,
        b: Src,
        c: Src,
    },
    /// `set`: the comparison of `a` and `b` (of `sty`; two halves each if
    /// `packed`), combined with a predicate, as 1.0 for a float `dty` or
    /// all ones for an integer one (per half when packed), else 0.
    Set {
        cmp: Cmp,
        sty: Ty,
        dty: Ty,
        packed: bool,
        comb: Option<(BoolOp, Src, bool)>,
        d: u32,
        a: Src,
        b: Src,
    },
    /// `cvt.rn{.relu}.f16x2.f32` / `.bf16x2.f32`: `a` into the upper half
    /// of `d`, `b` into the lower.
    CvtPack {
        ty: Ty,
        relu: bool,
        d: u32,
        a: Src,
        b: Src,
    },
    /// `tex`: a texture object's four channels at coordinates `c`
    /// (integers with `int_coords`, else floats; a layered geometry's
    /// layer first).
    Tex {
        geom: Geom,
        int_coords: bool,
        d: [u32; 4],
        handle: Src,
        c: [Src; 4],
    },
    /// `suld.b`: `n` values of `ty` from a surface at byte `c[0]`, row
    /// and slice (a layered geometry's layer first).
    Suld {
        geom: Geom,
        ty: Ty,
        n: u8,
        mode: crate::texture::SurfaceMode,
        d: [u32; 4],
        handle: Src,
        c: [Src; 4],
    },
    /// `sust.b`: the counterpart of [`Op::Suld`].
    Sust {
        geom: Geom,
        ty: Ty,
        n: u8,
        mode: crate::texture::SurfaceMode,
        v: [Src; 4],
        handle: Src,
        c: [Src; 4],
    },
    /// `txq` (`surface` false) and `suq`.
    Txq {
        surface: bool,
        query: crate::texture::Query,
        d: u32,
        handle: Src,
    },
    /// An instruction this executor does not run: its index in the
    /// module's refusals. Kernels that may reach it do not launch.
    Refused(u32),
}

/// The geometry of a texture or surface instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Geom {
    /// `.1d`.
    D1,
    /// `.2d`.
    D2,
    /// `.3d`.
    D3,
    /// `.a1d`: a layer, then x.
    A1,
    /// `.a2d`: a layer, then x and y.
    A2,
    /// `.cube`: a direction x, y, z.
    Cube,
    /// `.acube`: a cube's layer, then a direction.
    ACube,
}

impl Geom {
    /// The geometry of a modifier.
    pub fn from_name(s: &str) -> Option<Geom> {
        Some(match s {
            "1d" => Geom::D1,
            "2d" => Geom::D2,
            "3d" => Geom::D3,
            "a1d" => Geom::A1,
            "a2d" => Geom::A2,
            "cube" => Geom::Cube,
            "acube" => Geom::ACube,
            _ => return None,
        })
    }
    /// Coordinates besides the layer.
    pub fn dims(self) -> usize {
        match self {
            Geom::D1 | Geom::A1 => 1,
            Geom::D2 | Geom::A2 => 2,
            Geom::D3 | Geom::Cube | Geom::ACube => 3,
        }
    }
    /// Whether the first coordinate is a layer.
    pub fn layered(self) -> bool {
        matches!(self, Geom::A1 | Geom::A2 | Geom::ACube)
    }

    /// Whether it samples a cubemap by direction.
    pub fn cube(self) -> bool {
        matches!(self, Geom::Cube | Geom::ACube)
    }
    /// Operands of the coordinate vector: PTX pads three to four.
    pub fn operands(self) -> usize {
        match self.dims() + usize::from(self.layered()) {
            3 => 4,
            n => n,
        }
    }
}

/// An instruction with its guard predicate.
#[derive(Debug, Clone, PartialEq)]
pub struct Inst {
    /// `@p` / `@!p`: the predicate register and whether it is negated.
    pub guard: Option<(u32, bool)>,
    /// The operation.
    pub op: Op,
    /// The source line, for error messages.
    pub line: u32,
}
