//! PTX text to a [`Module`]: a lexer, a one-pass parser that decodes each
//! instruction to the executor's form, and the kernels' launch metadata.

use std::collections::HashMap;

use crate::half::{f32_to_bf16, f32_to_f16};
use crate::ir::*;
use crate::mem::{AtomKind, AtomTy, AtomicOp};
use crate::module::{Func, Module, ParamInfo, ParseError};

/// The names of the PTX ISA's instructions (the part before the first
/// dot, PTX ISA 9.0): valid PTX, whether or not this executor runs it.
const PTX_INSTRUCTIONS: &[&str] = &[
    "abs",
    "activemask",
    "add",
    "addc",
    "alloca",
    "and",
    "applypriority",
    "atom",
    "bar",
    "barrier",
    "bfe",
    "bfi",
    "bfind",
    "bmsk",
    "bra",
    "brev",
    "brkpt",
    "brx",
    "call",
    "clusterlaunchcontrol",
    "clz",
    "cnot",
    "copysign",
    "cos",
    "cp",
    "createpolicy",
    "cvt",
    "cvta",
    "discard",
    "div",
    "dp2a",
    "dp4a",
    "elect",
    "ex2",
    "exit",
    "fence",
    "fma",
    "fns",
    "getctarank",
    "griddepcontrol",
    "isspacep",
    "istypeof",
    "ld",
    "ldmatrix",
    "ldu",
    "lg2",
    "lop3",
    "mad",
    "mad24",
    "madc",
    "mapa",
    "match",
    "max",
    "mbarrier",
    "membar",
    "min",
    "mma",
    "mov",
    "movmatrix",
    "mul",
    "mul24",
    "multimem",
    "nanosleep",
    "neg",
    "not",
    "or",
    "pmevent",
    "popc",
    "prefetch",
    "prefetchu",
    "prmt",
    "rcp",
    "red",
    "redux",
    "rem",
    "ret",
    "rsqrt",
    "sad",
    "selp",
    "set",
    "setmaxnreg",
    "setp",
    "shf",
    "shfl",
    "shl",
    "shr",
    "sin",
    "slct",
    "sqrt",
    "st",
    "stackrestore",
    "stacksave",
    "stmatrix",
    "sub",
    "subc",
    "suld",
    "suq",
    "sured",
    "sust",
    "szext",
    "tanh",
    "tcgen05",
    "tensormap",
    "testp",
    "tex",
    "tld4",
    "trap",
    "txq",
    "vabsdiff",
    "vabsdiff2",
    "vabsdiff4",
    "vadd",
    "vadd2",
    "vadd4",
    "vavrg2",
    "vavrg4",
    "vmad",
    "vmax",
    "vmax2",
    "vmax4",
    "vmin",
    "vmin2",
    "vmin4",
    "vote",
    "vset",
    "vset2",
    "vset4",
    "vshl",
    "vshr",
    "vsub",
    "vsub2",
    "vsub4",
    "wgmma",
    "wmma",
    "xor",
];

impl Module {
    /// Parses and decodes a PTX module.
    pub fn parse(text: &str) -> Result<Module, ParseError> {
        let toks = lex(text)?;
        let mut p = Parser {
            toks,
            pos: 0,
            m: Module {
                code: Vec::new(),
                funcs: Vec::new(),
                nregs: 2, // register 0 is the sink `_`, 1 the carry flag
                statics: Vec::new(),
                shared_static: 0,
                local_size: 0,
                param_size: 0,
                version: String::new(),
                target: String::new(),
                refused: Vec::new(),
                variables: Vec::new(),
            },
            globals: HashMap::new(),
            fnames: HashMap::new(),
            call_fix: Vec::new(),
            depth: 0,
            shared_ends: HashMap::new(),
        };
        p.module()?;
        Ok(p.m)
    }
}

// ---------------------------------------------------------------- lexer

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum K {
    Word,
    Num,
    Str,
    P(u8),
}

#[derive(Debug, Clone, Copy)]
struct Tok<'a> {
    k: K,
    s: &'a str,
    line: u32,
}

fn lex(text: &str) -> Result<Vec<Tok<'_>>, ParseError> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    let mut line = 1u32;
    let word = |c: u8| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'$' | b'%' | b'.' | b':');
    while i < b.len() {
        let c = b[i];
        if c == b'\n' {
            line += 1;
            i += 1;
        } else if c.is_ascii_whitespace() {
            i += 1;
        } else if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let start = line;
            i += 2;
            loop {
                if i + 1 >= b.len() {
                    return Err(ParseError::new(start, "unterminated comment"));
                }
                if b[i] == b'*' && b[i + 1] == b'/' {
                    i += 2;
                    break;
                }
                if b[i] == b'\n' {
                    line += 1;
                }
                i += 1;
            }
        } else if c == b'"' {
            let s = i;
            i += 1;
            while i < b.len() && b[i] != b'"' && b[i] != b'\n' {
                i += 1;
            }
            if i >= b.len() || b[i] != b'"' {
                return Err(ParseError::new(line, "unterminated string"));
            }
            i += 1;
            out.push(Tok {
                k: K::Str,
                s: &text[s..i],
                line,
            });
        } else if c.is_ascii_digit() {
            let s = i;
            while i < b.len() {
                let d = b[i];
                let exp_sign = matches!(d, b'+' | b'-')
                    && matches!(b[i - 1], b'e' | b'E')
                    && !text[s..i].starts_with("0x")
                    && !text[s..i].starts_with("0f")
                    && !text[s..i].starts_with("0d")
                    && text[s..i].contains('.');
                if d.is_ascii_alphanumeric() || d == b'.' || exp_sign {
                    i += 1;
                } else {
                    break;
                }
            }
            out.push(Tok {
                k: K::Num,
                s: &text[s..i],
                line,
            });
        } else if c.is_ascii_alphabetic() || matches!(c, b'_' | b'$' | b'%' | b'.') {
            let s = i;
            // `:` belongs to a word only inside (`.shared::cta`), not at the
            // end (a label).
            while i < b.len() && word(b[i]) {
                if b[i] == b':' && b.get(i + 1) != Some(&b':') && (i == s || b[i - 1] != b':') {
                    break;
                }
                i += 1;
            }
            out.push(Tok {
                k: K::Word,
                s: &text[s..i],
                line,
            });
        } else if b",;{}[]()<>+-=@!|:".contains(&c) {
            out.push(Tok {
                k: K::P(c),
                s: &text[i..i + 1],
                line,
            });
            i += 1;
        } else {
            let ch = text[i..].chars().next().unwrap_or('?');
            return Err(ParseError::new(
                line,
                format!("unexpected character {ch:?}"),
            ));
        }
    }
    Ok(out)
}

// --------------------------------------------------------------- parser

#[derive(Debug, Clone, Copy)]
enum VarLoc {
    Shared(u32),
    Local(u32),
    Static(u32),
    KParam(u32),
    Param(u32),
}

#[derive(Debug, Clone)]
enum Opnd<'a> {
    Name(&'a str),
    Not(&'a str),
    Int(i128),
    F32(u32),
    F64(u64),
    Float(f64),
    Addr(Option<&'a str>, i64),
    Vec(Vec<Opnd<'a>>),
    Pair(&'a str, &'a str),
    List(Vec<Opnd<'a>>),
    /// `[a, b, ...]`: texture and surface operands, the object and
    /// its coordinates.
    Bracket(&'a str, Vec<Opnd<'a>>),
}

struct FnScope<'a> {
    regs: HashMap<&'a str, (u32, Ty)>,
    ranges: HashMap<&'a str, (u32, u32, Ty)>,
    vars: HashMap<&'a str, VarLoc>,
    labels: HashMap<&'a str, u32>,
    fix: Vec<(usize, &'a str, u32)>,
    entry: bool,
    regs32: u32,
    /// Offsets of the `.shared` variables the function names.
    shared_vars: std::cell::RefCell<std::collections::BTreeSet<u32>>,
}

struct Parser<'a> {
    toks: Vec<Tok<'a>>,
    pos: usize,
    m: Module,
    globals: HashMap<&'a str, VarLoc>,
    fnames: HashMap<&'a str, u32>,
    call_fix: Vec<(usize, &'a str, u32)>,
    depth: u32,
    shared_ends: HashMap<u32, u32>,
}

const MAX_NESTING: u32 = 32;
/// Registers of a module, all functions together (a translation unit with
/// many Thrust and CUB algorithms declares some 80,000): a launch's warps
/// reserve 256 bytes per register up to the last one its kernel uses,
/// as zeroed pages of which only the kernel's own are touched.
const MAX_REGS: u32 = 1 << 18;

fn align_up(x: u32, a: u32) -> u32 {
    let a = a.max(1);
    x.div_ceil(a).saturating_mul(a)
}

const MAX_STATIC: u32 = 1 << 30;

/// `v` if it is at most [`MAX_STATIC`] (a size or an end in a space).
fn bounded(v: Option<u32>) -> Option<u32> {
    v.filter(|&v| v <= MAX_STATIC)
}

/// Places `size` bytes aligned to `align` at `*end` in a space: their
/// offset, `*end` moved past them (`None` past [`MAX_STATIC`]).
fn place(end: &mut u32, align: u32, size: u32) -> Option<u32> {
    let off = align_up(*end, align);
    *end = bounded(off.checked_add(size))?;
    Some(off)
}

/// The error `msg` at `line`.
fn fail<T>(line: u32, msg: impl Into<String>) -> Result<T, ParseError> {
    Err(ParseError::new(line, msg))
}

impl<'a> Parser<'a> {
    fn line(&self) -> u32 {
        self.toks
            .get(self.pos)
            .or(self.toks.last())
            .map_or(1, |t| t.line)
    }
    fn err<T>(&self, msg: impl Into<String>) -> Result<T, ParseError> {
        fail(self.line(), msg)
    }
    /// `v`, or the error `msg` where there is none.
    fn require<T>(&self, v: Option<T>, msg: impl Into<String>) -> Result<T, ParseError> {
        v.map_or_else(|| self.err(msg), Ok)
    }
    /// The type a `.type` word names (`what` says what it types).
    fn ty_named(&self, w: &str, what: &str) -> Result<Ty, ParseError> {
        self.require(Ty::from_name(&w[1..]), format!("unknown {what} '{w}'"))
    }
    fn peek(&self) -> Option<Tok<'a>> {
        self.toks.get(self.pos).copied()
    }
    fn next(&mut self) -> Result<Tok<'a>, ParseError> {
        match self.peek() {
            Some(t) => {
                self.pos += 1;
                Ok(t)
            }
            None => self.err("unexpected end of input"),
        }
    }
    fn is_p(&self, c: u8) -> bool {
        matches!(self.peek(), Some(Tok { k: K::P(x), .. }) if x == c)
    }
    fn eat_p(&mut self, c: u8) -> bool {
        if self.is_p(c) {
            self.pos += 1;
            true
        } else {
            false
        }
    }
    fn expect_p(&mut self, c: u8) -> Result<(), ParseError> {
        if self.eat_p(c) {
            Ok(())
        } else {
            let got = self.peek().map_or("end of input", |t| t.s);
            self.err(format!("expected '{}', found '{got}'", c as char))
        }
    }
    fn word(&mut self) -> Result<&'a str, ParseError> {
        let t = self.next()?;
        if t.k != K::Word {
            self.pos -= 1;
            return self.err(format!("expected a name, found '{}'", t.s));
        }
        Ok(t.s)
    }
    fn number(&mut self) -> Result<i128, ParseError> {
        let neg = self.eat_p(b'-');
        let t = self.next()?;
        let v = match (t.k, parse_int(t.s)) {
            (K::Num, Some(v)) => v,
            _ => {
                self.pos -= 1;
                return self.err(format!("expected a number, found '{}'", t.s));
            }
        };
        Ok(if neg { -v } else { v })
    }
    fn u32_num(&mut self) -> Result<u32, ParseError> {
        let v = self.number()?;
        u32::try_from(v).or_else(|_| self.err(format!("{v} out of range")))
    }
    /// Skips the rest of the current line (`.loc`, `.file` have no `;`).
    fn skip_line(&mut self) {
        let l = self.line();
        while self
            .peek()
            .is_some_and(|t| t.line == l && t.k != K::P(b';'))
        {
            self.pos += 1;
        }
        self.eat_p(b';');
    }
    fn skip_to_semi(&mut self) -> Result<(), ParseError> {
        while !self.eat_p(b';') {
            self.next()?;
        }
        Ok(())
    }

    fn module(&mut self) -> Result<(), ParseError> {
        while let Some(t) = self.peek() {
            match t.s {
                ".version" => {
                    self.pos += 1;
                    self.m.version = self.next()?.s.to_string();
                }
                ".target" => {
                    self.pos += 1;
                    let mut v = vec![self.word()?];
                    while self.eat_p(b',') {
                        v.push(self.word()?);
                    }
                    self.m.target = v.join(",");
                }
                ".address_size" => {
                    self.pos += 1;
                    if self.number()? != 64 {
                        return self.err("only .address_size 64 is supported");
                    }
                }
                ".loc" | ".file" => self.skip_line(),
                ".pragma" => {
                    self.pos += 1;
                    self.skip_to_semi()?;
                }
                ".section" => {
                    self.pos += 1;
                    self.skip_block()?;
                }
                ".visible" | ".weak" | ".extern" | ".common" => {
                    self.pos += 1;
                    let ext = t.s == ".extern";
                    self.decl(ext)?;
                }
                _ => self.decl(false)?,
            }
        }
        for &(at, name, line) in &self.call_fix {
            let Some(&f) = self.fnames.get(name) else {
                return Err(ParseError::new(
                    line,
                    format!("call of undefined function '{name}'"),
                ));
            };
            if let Op::Call { func, .. } = &mut self.m.code[at].op {
                *func = f;
            }
        }
        // Each function's shared memory over what it may call.
        for i in 0..self.m.funcs.len() {
            let mut seen = vec![false; self.m.funcs.len()];
            let mut todo = vec![i];
            let mut vars = std::collections::BTreeSet::new();
            let mut regs = Vec::new();
            let mut units = 0u32;
            let mut refused = None;
            while let Some(j) = todo.pop() {
                if std::mem::replace(&mut seen[j], true) {
                    continue;
                }
                let f = &self.m.funcs[j];
                vars.extend(f.shared_vars.iter().copied());
                regs.push(f.regs);
                units = units.saturating_add(f.regs32);
                for inst in &self.m.code[f.start as usize..f.end.max(f.start) as usize] {
                    match inst.op {
                        Op::Call { func, .. } => todo.push(func as usize),
                        Op::Refused(r) => refused = Some(refused.map_or(r, |x: u32| x.min(r))),
                        _ => {}
                    }
                }
            }
            self.m.funcs[i].refused = refused;
            // Each variable as (start, end) in the module's one layout,
            // which places other kernels' variables between them: the
            // block spans to the last end, while a GPU counts a kernel's
            // static shared memory as what its variables take.
            let spans = vars
                .iter()
                .map(|&o| (o, self.shared_ends.get(&o).copied().unwrap_or(o)));
            self.m.funcs[i].shared_total = spans.clone().map(|(_, e)| e).max().unwrap_or(0);
            self.m.funcs[i].shared_size = spans.map(|(o, e)| e - o).fold(0u32, u32::saturating_add);
            self.m.funcs[i].reach_regs = regs;
            self.m.funcs[i].regs32_total = units;
        }
        Ok(())
    }

    fn skip_block(&mut self) -> Result<(), ParseError> {
        while !self.is_p(b'{') {
            self.next()?;
        }
        let mut depth = 0;
        loop {
            let t = self.next()?;
            match t.k {
                K::P(b'{') => depth += 1,
                K::P(b'}') => {
                    depth -= 1;
                    if depth == 0 {
                        return Ok(());
                    }
                }
                _ => {}
            }
        }
    }

    fn decl(&mut self, ext: bool) -> Result<(), ParseError> {
        let t = self.peek().map_or("", |t| t.s);
        match t {
            ".entry" | ".func" => self.function(ext),
            ".global" | ".const" | ".shared" => {
                self.pos += 1;
                let loc = self.var_decl(t, ext, None)?;
                for (name, l, size) in loc {
                    self.globals.insert(name, l);
                    if let VarLoc::Static(off) = l {
                        self.m.variables.push((name.to_string(), off, size));
                    }
                }
                Ok(())
            }
            "" => self.err("unexpected end of input"),
            other => self.err(format!("unexpected '{other}' at module scope")),
        }
    }

    /// After the space word: `[.align N] [.vN] .type name[[N]] [= init], ...;`
    fn var_decl(
        &mut self,
        space: &str,
        ext: bool,
        mut fs: Option<&mut FnScope<'a>>,
    ) -> Result<Vec<(&'a str, VarLoc, u32)>, ParseError> {
        let mut align = 0u32;
        let mut ty = None;
        let mut vecn = 1u32;
        loop {
            let w = self.word()?;
            match w {
                ".align" => align = self.u32_num()?,
                ".v2" => vecn = 2,
                ".v4" => vecn = 4,
                ".ptr" | ".global" | ".shared" | ".const" | ".local" => {}
                w if w.starts_with('.') => {
                    ty = Some(self.ty_named(w, "type")?);
                    break;
                }
                _ => {
                    self.pos -= 1;
                    break;
                }
            }
        }
        let Some(ty) = ty else {
            return self.err("variable without a type");
        };
        let esize = ty.bytes() * vecn;
        let align = if align == 0 { esize } else { align };
        if !align.is_power_of_two() {
            return self.err(format!("alignment {align} is not a power of two"));
        }
        let mut out = Vec::new();
        loop {
            let name = self.word()?;
            let mut count = 1u32;
            let mut unsized_array = false;
            if self.eat_p(b'<') {
                return self.err("parameterized variable names are only for .reg");
            }
            while self.eat_p(b'[') {
                if self.eat_p(b']') {
                    unsized_array = true;
                    continue;
                }
                let n = self.u32_num()?;
                self.expect_p(b']')?;
                count = self.require(bounded(count.checked_mul(n)), "array too large")?;
            }
            let size = self.require(bounded(esize.checked_mul(count)), "array too large")?;
            let mut init = Vec::new();
            if self.eat_p(b'=') {
                self.initialiser(ty, &mut init)?;
                if init.len() as u64 > size as u64 && !unsized_array {
                    return self.err("initialiser larger than the variable");
                }
            }
            let size = if unsized_array {
                (init.len() as u32).max(if ext { 0 } else { size })
            } else {
                size
            };
            let loc = match space {
                ".shared" if ext || (unsized_array && init.is_empty()) => {
                    // `extern .shared` arrays all start where the dynamic
                    // shared memory does: resolved at launch from this marker.
                    VarLoc::Shared(u32::MAX)
                }
                ".shared" => {
                    let off = place(&mut self.m.shared_static, align, size);
                    let off = self.require(off, "shared memory too large")?;
                    let e = self.shared_ends.entry(off).or_insert(0);
                    *e = (*e).max(off + size);
                    VarLoc::Shared(off)
                }
                ".local" => {
                    let off = place(&mut self.m.local_size, align, size);
                    VarLoc::Local(self.require(off, "local memory too large")?)
                }
                ".param" => {
                    let off = place(&mut self.m.param_size, align, size);
                    VarLoc::Param(self.require(off, "parameters too large")?)
                }
                _ => {
                    let mut end = self.m.statics.len() as u32;
                    let off = self.require(place(&mut end, align, size), "variables too large")?;
                    self.m.statics.resize(end as usize, 0);
                    let n = init.len().min(size as usize);
                    self.m.statics[off as usize..off as usize + n].copy_from_slice(&init[..n]);
                    VarLoc::Static(off)
                }
            };
            if let Some(fs) = fs.as_deref_mut() {
                fs.vars.insert(name, loc);
            }
            out.push((name, loc, size));
            if !self.eat_p(b',') {
                break;
            }
        }
        self.expect_p(b';')?;
        Ok(out)
    }

    fn initialiser(&mut self, ty: Ty, out: &mut Vec<u8>) -> Result<(), ParseError> {
        self.nest(|p| p.initialiser_inner(ty, out))
    }

    /// Runs `f` one nesting level deeper: bounded, so that `{{{{...` or
    /// `- - - ...` cannot exhaust the stack.
    fn nest<T>(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<T, ParseError>,
    ) -> Result<T, ParseError> {
        if self.depth >= MAX_NESTING {
            return self.err("nested too deeply");
        }
        self.depth += 1;
        let r = f(self);
        self.depth -= 1;
        r
    }

    fn initialiser_inner(&mut self, ty: Ty, out: &mut Vec<u8>) -> Result<(), ParseError> {
        if self.eat_p(b'{') {
            loop {
                self.initialiser(ty, out)?;
                if self.eat_p(b'}') {
                    return Ok(());
                }
                self.expect_p(b',')?;
            }
        }
        if out.len() > MAX_STATIC as usize {
            return self.err("initialiser too large");
        }
        let o = self.operand()?;
        let bits = match imm_bits(&o, ty) {
            Some(b) => b,
            None => return self.err("unsupported initialiser (only numbers)"),
        };
        out.extend_from_slice(&bits.to_le_bytes()[..ty.bytes() as usize]);
        Ok(())
    }

    fn function(&mut self, ext: bool) -> Result<(), ParseError> {
        let line = self.line();
        let entry = self.word()? == ".entry";
        let mut fs = FnScope {
            regs: HashMap::new(),
            ranges: HashMap::new(),
            vars: HashMap::new(),
            labels: HashMap::new(),
            fix: Vec::new(),
            entry,
            regs32: 0,
            shared_vars: Default::default(),
        };
        let mut ret = None;
        if !entry && self.is_p(b'(') {
            self.pos += 1;
            let (_, p) = self.param_decl(&mut fs, false)?;
            ret = Some((p.offset, p.size));
            self.expect_p(b')')?;
        }
        let name = self.word()?;
        let mut params = Vec::new();
        let mut kparam_end = 0u32;
        if self.eat_p(b'(') && !self.eat_p(b')') {
            {
                loop {
                    let (off, mut p) = self.param_decl(&mut fs, entry)?;
                    if entry {
                        p.offset = align_up(kparam_end, p.align);
                        kparam_end = p.offset + p.size;
                        if let Some(VarLoc::KParam(o)) = fs
                            .vars
                            .values_mut()
                            .find(|v| matches!(v, VarLoc::KParam(u32::MAX)))
                        {
                            *o = p.offset;
                        }
                    }
                    params.push((p, off));
                    if self.eat_p(b')') {
                        break;
                    }
                    self.expect_p(b',')?;
                }
            }
        }
        let mut max_threads = None;
        while let Some(t) = self.peek() {
            match t.s {
                ".maxntid" | ".reqntid" => {
                    self.pos += 1;
                    let mut n = self.u32_num()?;
                    while self.eat_p(b',') {
                        n = n.saturating_mul(self.u32_num()?);
                    }
                    max_threads = Some(n);
                }
                ".minnctapersm" | ".maxnreg" | ".maxnctapersm" | ".maxclusterrank" => {
                    self.pos += 1;
                    self.u32_num()?;
                }
                ".reqnctapercluster" | ".explicitcluster" => {
                    self.pos += 1;
                    while self
                        .peek()
                        .is_some_and(|t| t.k == K::Num || t.k == K::P(b','))
                    {
                        self.pos += 1;
                    }
                }
                ".noreturn" | ".pragma" => {
                    self.pos += 1;
                    if t.s == ".pragma" {
                        self.skip_to_semi()?;
                    }
                }
                _ => break,
            }
        }
        let idx = match self.fnames.get(name) {
            Some(&i) => i,
            None => {
                let i = self.m.funcs.len() as u32;
                self.fnames.insert(name, i);
                self.m.funcs.push(Func {
                    name: name.to_string(),
                    entry,
                    start: 0,
                    defined: false,
                    params: Vec::new(),
                    ret: None,
                    regs32: 0,
                    max_threads,
                    line,
                    shared_total: 0,
                    shared_vars: Vec::new(),
                    shared_size: 0,
                    end: 0,
                    regs: (0, 0),
                    reach_regs: Vec::new(),
                    regs32_total: 0,
                    refused: None,
                });
                i
            }
        };
        if self.eat_p(b';') || ext {
            if !self.eat_p(b';') && ext && self.is_p(b'{') {
                return self.err("an .extern function has no body");
            }
            let f = &mut self.m.funcs[idx as usize];
            if !f.defined {
                f.params = params;
                f.ret = ret;
            }
            return Ok(());
        }
        if self.m.funcs[idx as usize].defined {
            return self.err(format!("function '{name}' defined twice"));
        }
        let start = self.m.code.len() as u32;
        let regs_lo = self.m.nregs;
        {
            let f = &mut self.m.funcs[idx as usize];
            f.params = params;
            f.ret = ret;
            f.start = start;
            f.defined = true;
            f.line = line;
        }
        self.body(&mut fs)?;
        for &(at, label, l) in &fs.fix {
            let Some(&target) = fs.labels.get(label) else {
                return fail(l, format!("undefined label '{label}'"));
            };
            if let Op::Bra { target: t } = &mut self.m.code[at].op {
                *t = target;
            }
        }
        // A body that runs off its end returns.
        self.m.code.push(Inst {
            guard: None,
            op: Op::Ret,
            line: self.line(),
        });
        let f = &mut self.m.funcs[idx as usize];
        f.regs32 = fs.regs32;
        f.shared_vars = fs.shared_vars.take().into_iter().collect();
        f.end = self.m.code.len() as u32;
        f.regs = (regs_lo, self.m.nregs);
        Ok(())
    }

    /// `.param [.align N] .type [.ptr .space .align N] name[[N]]`.
    fn param_decl(
        &mut self,
        fs: &mut FnScope<'a>,
        kernel: bool,
    ) -> Result<(u32, ParamInfo), ParseError> {
        let t = self.word()?;
        if t != ".param" && t != ".reg" {
            self.pos -= 1;
            return self.err(format!("expected .param, found '{t}'"));
        }
        let mut align = 0;
        let mut ty = None;
        let mut name = None;
        while name.is_none() {
            let w = self.word()?;
            match w {
                ".align" => {
                    let a = self.u32_num()?;
                    // `.ptr .align N` states the pointee's alignment, not
                    // the parameter's.
                    if ty.is_none() {
                        align = a;
                    }
                }
                ".ptr" | ".global" | ".shared" | ".const" | ".local" => {}
                w if w.starts_with('.') => ty = Some(self.ty_named(w, "type")?),
                w => name = Some(w),
            }
        }
        let (Some(ty), Some(name)) = (ty, name) else {
            return self.err("parameter without a type");
        };
        let mut count = 1u32;
        while self.eat_p(b'[') {
            let n = self.u32_num()?;
            self.expect_p(b']')?;
            let c = count.checked_mul(n).filter(|&c| c <= 1 << 20);
            count = self.require(c, "parameter too large")?;
        }
        let size = ty.bytes() * count;
        let align = if align == 0 { ty.bytes() } else { align };
        if !align.is_power_of_two() {
            return self.err("alignment is not a power of two");
        }
        if kernel {
            fs.vars.insert(name, VarLoc::KParam(u32::MAX));
            return Ok((
                0,
                ParamInfo {
                    offset: 0,
                    size,
                    align,
                },
            ));
        }
        let off = place(&mut self.m.param_size, align.max(8), size);
        let off = self.require(off, "parameters too large")?;
        fs.vars.insert(name, VarLoc::Param(off));
        Ok((
            off,
            ParamInfo {
                offset: off,
                size,
                align,
            },
        ))
    }

    /// `.reg` (`joined`: the modifiers written onto it without a space,
    /// `.reg.b16`, as inline assembly often has them) `.type name, ...;`
    fn reg_decl(&mut self, fs: &mut FnScope<'a>, joined: &'a str) -> Result<(), ParseError> {
        let mut ty = None;
        let mut vecn = 1;
        // `.v2.b32` as `.v2`, `.b32`.
        let dots: Vec<usize> = joined.match_indices('.').map(|(i, _)| i).collect();
        let mut glued = dots
            .iter()
            .enumerate()
            .map(|(k, &i)| &joined[i..dots.get(k + 1).copied().unwrap_or(joined.len())]);
        loop {
            let w = match glued.next() {
                Some(w) => w,
                None if self.peek().is_some_and(|t| t.s.starts_with('.')) => self.word()?,
                None => break,
            };
            match w {
                ".v2" => vecn = 2,
                ".v4" => vecn = 4,
                ".align" => {
                    self.u32_num()?;
                }
                _ => ty = Some(self.ty_named(w, "register type")?),
            }
        }
        if vecn != 1 {
            return self.err("vector registers are not supported");
        }
        let Some(ty) = ty else {
            return self.err(".reg without a type");
        };
        loop {
            let name = self.word()?;
            let count = if self.eat_p(b'<') {
                let n = self.u32_num()?;
                self.expect_p(b'>')?;
                n
            } else {
                1
            };
            if count > MAX_REGS || self.m.nregs.saturating_add(count) > MAX_REGS {
                return self.err("too many registers");
            }
            if self.is_p(b'<') {
                return self.err("bad register range");
            }
            if self.toks[self.pos - 1].s == ">" {
                // `%r<N>` declares `%r0`..`%r{N-1}`: kept as a range.
                fs.ranges.insert(name, (self.m.nregs, count, ty));
                self.m.nregs += count;
                fs.regs32 += count * ty.bits().div_ceil(32);
            } else {
                fs.regs.insert(name, (self.m.nregs, ty));
                self.m.nregs += 1;
                fs.regs32 += ty.bits().div_ceil(32);
            }
            if !self.eat_p(b',') {
                break;
            }
        }
        self.expect_p(b';')
    }

    fn body(&mut self, fs: &mut FnScope<'a>) -> Result<(), ParseError> {
        self.expect_p(b'{')?;
        let mut depth = 0;
        loop {
            let Some(t) = self.peek() else {
                return self.err("function body not closed");
            };
            match t.k {
                K::P(b'}') => {
                    self.pos += 1;
                    if depth == 0 {
                        return Ok(());
                    }
                    depth -= 1;
                }
                K::P(b'{') => {
                    self.pos += 1;
                    depth += 1;
                }
                K::Word if t.s == ".reg" || t.s.starts_with(".reg.") => {
                    self.pos += 1;
                    self.reg_decl(fs, &t.s[4..])?;
                }
                K::Word
                    if matches!(t.s, ".local" | ".shared" | ".param" | ".global" | ".const") =>
                {
                    self.pos += 1;
                    self.var_decl(t.s, false, Some(fs))?;
                }
                K::Word if t.s == ".loc" || t.s == ".file" => self.skip_line(),
                K::Word if t.s == ".pragma" => {
                    self.pos += 1;
                    self.skip_to_semi()?;
                }
                K::Word
                    if self
                        .toks
                        .get(self.pos + 1)
                        .is_some_and(|n| n.k == K::P(b':')) =>
                {
                    self.pos += 2;
                    if fs.labels.insert(t.s, self.m.code.len() as u32).is_some() {
                        return fail(t.line, format!("label '{}' defined twice", t.s));
                    }
                }
                _ => self.instruction(fs)?,
            }
        }
    }

    fn operand(&mut self) -> Result<Opnd<'a>, ParseError> {
        self.nest(|p| p.operand_inner())
    }

    /// Comma-separated operands up to and with `close` (at least one).
    fn operands_to(&mut self, close: u8) -> Result<Vec<Opnd<'a>>, ParseError> {
        let mut v = Vec::new();
        loop {
            v.push(self.operand()?);
            if self.eat_p(close) {
                return Ok(v);
            }
            self.expect_p(b',')?;
        }
    }

    fn operand_inner(&mut self) -> Result<Opnd<'a>, ParseError> {
        let t = self.next()?;
        match t.k {
            K::P(b'[') => {
                let mut base = None;
                let mut off: i64 = 0;
                if self.peek().is_some_and(|t| t.k == K::Word) {
                    let w = self.word()?;
                    if self.eat_p(b',') {
                        // `[tex, {x, y}]`: a texture or surface operand.
                        let rest = self.operands_to(b']')?;
                        return Ok(Opnd::Bracket(w, rest));
                    }
                    base = Some(w);
                } else {
                    off = i64::try_from(self.number()?)
                        .or_else(|_| self.err("offset out of range"))?;
                }
                while self.is_p(b'+') || self.is_p(b'-') {
                    let neg = self.next()?.s == "-";
                    let v = i64::try_from(self.number()?)
                        .or_else(|_| self.err("offset out of range"))?;
                    off = off.wrapping_add(if neg { v.wrapping_neg() } else { v });
                }
                self.expect_p(b']')?;
                Ok(Opnd::Addr(base, off))
            }
            K::P(b'{') => Ok(Opnd::Vec(self.operands_to(b'}')?)),
            K::P(b'(') if self.eat_p(b')') => Ok(Opnd::List(Vec::new())),
            K::P(b'(') => Ok(Opnd::List(self.operands_to(b')')?)),
            K::P(b'!') => Ok(Opnd::Not(self.word()?)),
            K::P(b'-') => match self.operand()? {
                Opnd::Int(v) => Ok(Opnd::Int(-v)),
                Opnd::Float(v) => Ok(Opnd::Float(-v)),
                Opnd::F32(b) => Ok(Opnd::F32(b ^ 0x8000_0000)),
                Opnd::F64(b) => Ok(Opnd::F64(b ^ (1 << 63))),
                _ => self.err("'-' before a non-number"),
            },
            K::Num => match parse_num(t.s) {
                Some(v) => Ok(v),
                None => {
                    self.pos -= 1;
                    self.err(format!("bad number '{}'", t.s))
                }
            },
            K::Word => {
                if self.eat_p(b'|') {
                    return Ok(Opnd::Pair(t.s, self.word()?));
                }
                Ok(Opnd::Name(t.s))
            }
            _ => {
                self.pos -= 1;
                self.err(format!("unexpected '{}'", t.s))
            }
        }
    }

    fn instruction(&mut self, fs: &mut FnScope<'a>) -> Result<(), ParseError> {
        let line = self.line();
        let mut guard = None;
        if self.eat_p(b'@') {
            let neg = self.eat_p(b'!');
            let p = self.word()?;
            let (r, ty) = self.require(reg_of(fs, p), format!("undefined predicate '{p}'"))?;
            if ty != Ty::Pred {
                return self.err(format!("'{p}' is not a predicate"));
            }
            guard = Some((r, neg));
        }
        let opcode = self.word()?;
        let mut ops = Vec::new();
        if !self.eat_p(b';') {
            loop {
                ops.push(self.operand()?);
                if self.eat_p(b';') {
                    break;
                }
                if !self.eat_p(b',') {
                    // `call (r), f, (a)` and plain lists are comma separated;
                    // anything else is an error.
                    let got = self.peek().map_or("end of input", |t| t.s);
                    return self.err(format!("expected ',' or ';', found '{got}'"));
                }
            }
        }
        let at = self.m.code.len();
        let op = {
            let mut d = Decoder {
                fs,
                line,
                globals: &self.globals,
                call_fix: &mut self.call_fix,
                at,
                sink: 0,
            };
            match d.decode(opcode, &ops) {
                Ok(op) => op,
                // Valid PTX this executor cannot run: the kernels that
                // reach it fail to launch, naming it; the others run.
                Err(mut e) if e.unsupported => {
                    if !e.msg.contains(opcode) {
                        e.msg = format!("'{opcode}': {}", e.msg);
                    }
                    self.m.refused.push(e);
                    Op::Refused(self.m.refused.len() as u32 - 1)
                }
                Err(e) => return Err(e),
            }
        };
        self.m.code.push(Inst { guard, op, line });
        Ok(())
    }
}

fn reg_of(fs: &FnScope<'_>, name: &str) -> Option<(u32, Ty)> {
    if let Some(&r) = fs.regs.get(name) {
        return Some(r);
    }
    let digits = name.bytes().rev().take_while(u8::is_ascii_digit).count();
    let (prefix, num) = name.split_at(name.len() - digits);
    // `%r01` is not `%r1`.
    if num.is_empty() || (num.len() > 1 && num.starts_with('0')) {
        return None;
    }
    let (base, count, ty) = *fs.ranges.get(prefix)?;
    let i: u32 = num.parse().ok()?;
    (i < count).then_some((base + i, ty))
}

fn parse_int(s: &str) -> Option<i128> {
    let s = s.strip_suffix('U').unwrap_or(s);
    if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        return i128::from_str_radix(h, 16).ok();
    }
    if let Some(b) = s.strip_prefix("0b").or_else(|| s.strip_prefix("0B")) {
        return i128::from_str_radix(b, 2).ok();
    }
    if s.len() > 1 && s.starts_with('0') && s.bytes().all(|c| c.is_ascii_digit()) {
        return i128::from_str_radix(&s[1..], 8).ok();
    }
    s.parse().ok()
}

fn parse_num(s: &str) -> Option<Opnd<'static>> {
    if let Some(h) = s.strip_prefix("0f").or_else(|| s.strip_prefix("0F")) {
        return (h.len() == 8)
            .then(|| u32::from_str_radix(h, 16).ok().map(Opnd::F32))
            .flatten();
    }
    if let Some(h) = s.strip_prefix("0d").or_else(|| s.strip_prefix("0D")) {
        return (h.len() == 16)
            .then(|| u64::from_str_radix(h, 16).ok().map(Opnd::F64))
            .flatten();
    }
    if let Some(v) = parse_int(s) {
        return Some(Opnd::Int(v));
    }
    if s.bytes()
        .all(|c| c.is_ascii_digit() || matches!(c, b'.' | b'e' | b'E' | b'+' | b'-'))
    {
        return s.parse::<f64>().ok().map(Opnd::Float);
    }
    None
}

/// The raw bits of a literal as an operand of type `ty`.
fn imm_bits(o: &Opnd<'_>, ty: Ty) -> Option<u64> {
    let f = |v: f64| match ty {
        Ty::F32 => (v as f32).to_bits() as u64,
        Ty::F16 => f32_to_f16(v as f32) as u64,
        Ty::Bf16 => f32_to_bf16(v as f32) as u64,
        _ => v.to_bits(),
    };
    Some(match *o {
        Opnd::Int(v) if ty.float() => f(v as f64),
        Opnd::Int(v) => v as u64,
        Opnd::F32(b) if ty == Ty::F32 || !ty.float() => b as u64,
        Opnd::F32(b) => f(f32::from_bits(b) as f64),
        Opnd::F64(b) if ty == Ty::F64 || !ty.float() => b,
        Opnd::F64(b) => f(f64::from_bits(b)),
        Opnd::Float(v) if ty.float() => f(v),
        _ => return None,
    })
}

fn sreg(name: &str) -> Option<Sreg> {
    let dim = |s: &str| match s {
        "x" => Some(0),
        "y" => Some(1),
        "z" => Some(2),
        _ => None,
    };
    if let Some((base, d)) = name.split_once('.') {
        let d = dim(d)?;
        return Some(match base {
            "%tid" => Sreg::Tid(d),
            "%ntid" => Sreg::Ntid(d),
            "%ctaid" => Sreg::Ctaid(d),
            "%nctaid" => Sreg::Nctaid(d),
            _ => return None,
        });
    }
    Some(match name {
        "%tid" => Sreg::Tid(0),
        "%ntid" => Sreg::Ntid(0),
        "%laneid" => Sreg::LaneId,
        "%warpid" => Sreg::WarpId,
        "%nwarpid" => Sreg::NWarpId,
        "%smid" => Sreg::SmId,
        "%nsmid" => Sreg::NSmId,
        "%gridid" => Sreg::GridId,
        "%clock" => Sreg::Clock,
        "%clock64" => Sreg::Clock64,
        "%globaltimer" => Sreg::GlobalTimer,
        "%lanemask_eq" => Sreg::LaneMaskEq,
        "%lanemask_lt" => Sreg::LaneMaskLt,
        "%lanemask_le" => Sreg::LaneMaskLe,
        "%lanemask_gt" => Sreg::LaneMaskGt,
        "%lanemask_ge" => Sreg::LaneMaskGe,
        "%dynamic_smem_size" => Sreg::DynSmem,
        "%total_smem_size" => Sreg::TotalSmem,
        "%reserved_smem_offset_begin" => Sreg::ReservedBegin,
        "%reserved_smem_offset_end" => Sreg::ReservedEnd,
        "%reserved_smem_offset_cap" => Sreg::ReservedCap,
        "%reserved_smem_offset_0" => Sreg::Reserved(0),
        "%reserved_smem_offset_1" => Sreg::Reserved(1),
        _ => {
            let n: u8 = name.strip_prefix("%envreg")?.parse().ok()?;
            // `%envreg07` is not a register name.
            if n >= 32 || name.len() != "%envreg".len() + n.to_string().len() {
                return None;
            }
            Sreg::EnvReg(n)
        }
    })
}

struct Decoder<'p, 'a> {
    fs: &'p mut FnScope<'a>,
    line: u32,
    globals: &'p HashMap<&'a str, VarLoc>,
    call_fix: &'p mut Vec<(usize, &'a str, u32)>,
    at: usize,
    sink: u32,
}

/// Modifiers of an opcode, split once.
struct Mods<'a> {
    base: &'a str,
    list: Vec<&'a str>,
}

impl<'a> Mods<'a> {
    fn has(&self, m: &str) -> bool {
        self.list.contains(&m)
    }
    /// The value of the first entry of `table` whose modifier the opcode
    /// has.
    fn pick<T: Copy>(&self, table: &[(&str, T)]) -> Option<T> {
        table.iter().find(|(m, _)| self.has(m)).map(|&(_, v)| v)
    }
    /// The value `table` gives the first of the opcode's modifiers it
    /// names.
    fn find<T: Copy>(&self, table: &[(&str, T)]) -> Option<T> {
        self.list
            .iter()
            .find_map(|x| table.iter().find(|(m, _)| m == x).map(|&(_, v)| v))
    }
    fn types(&self) -> Vec<Ty> {
        self.list.iter().filter_map(|m| Ty::from_name(m)).collect()
    }
    fn rnd(&self) -> Rnd {
        self.find(&[
            ("rn", Rnd::Rn),
            ("rz", Rnd::Rz),
            ("rm", Rnd::Rm),
            ("rp", Rnd::Rp),
            ("rni", Rnd::Rni),
            ("rzi", Rnd::Rzi),
            ("rmi", Rnd::Rmi),
            ("rpi", Rnd::Rpi),
        ])
        .unwrap_or(Rnd::Default)
    }
    fn space(&self) -> Space {
        for m in &self.list {
            let m = m.split("::").next().unwrap_or(m);
            return match m {
                "global" => Space::Global,
                "shared" => Space::Shared,
                "local" => Space::Local,
                "const" => Space::Const,
                "param" => Space::Param,
                _ => continue,
            };
        }
        Space::Generic
    }
    fn vec(&self) -> u8 {
        if self.has("v4") {
            4
        } else if self.has("v2") {
            2
        } else {
            1
        }
    }
}

impl<'p, 'a> Decoder<'p, 'a> {
    fn err<T>(&self, msg: impl Into<String>) -> Result<T, ParseError> {
        fail(self.line, msg)
    }

    /// Valid PTX this executor does not run: the kernels that reach it
    /// are refused, the rest of the module loads.
    fn unsup<T>(&self, msg: impl Into<String>) -> Result<T, ParseError> {
        Err(ParseError {
            unsupported: true,
            ..ParseError::new(self.line, msg)
        })
    }

    fn var(&self, name: &str) -> Option<VarLoc> {
        self.fs
            .vars
            .get(name)
            .or_else(|| self.globals.get(name))
            .copied()
    }

    fn dst(&self, o: &Opnd<'a>) -> Result<u32, ParseError> {
        match o {
            Opnd::Name("_") => Ok(self.sink),
            Opnd::Name(n) => match reg_of(self.fs, n) {
                Some((r, _)) => Ok(r),
                None => self.err(format!("undefined register '{n}'")),
            },
            _ => self.err("destination is not a register"),
        }
    }

    /// A destination that may carry a predicate too (`r|p`).
    fn dst_pred(&self, o: &Opnd<'a>) -> Result<(u32, Option<u32>), ParseError> {
        match o {
            Opnd::Pair(a, b) => Ok((self.dst(&Opnd::Name(a))?, self.pred_dst(b)?)),
            x => Ok((self.dst(x)?, None)),
        }
    }

    /// `o[..N]` as sources of the types `tys`.
    fn srcs<const N: usize>(&self, o: &[Opnd<'a>], tys: [Ty; N]) -> Result<[Src; N], ParseError> {
        let mut out = [Src::Imm(0); N];
        for ((s, x), ty) in out.iter_mut().zip(o).zip(tys) {
            *s = self.src(x, ty)?;
        }
        Ok(out)
    }

    /// The usual operands: the destination `o[0]`, then `N` sources.
    fn dst_srcs<const N: usize>(
        &self,
        o: &[Opnd<'a>],
        tys: [Ty; N],
    ) -> Result<(u32, [Src; N]), ParseError> {
        Ok((self.dst(&o[0])?, self.srcs(&o[1..], tys)?))
    }

    fn dst_bits(&self, o: &Opnd<'a>) -> u32 {
        match o {
            Opnd::Name(n) => reg_of(self.fs, n).map_or(64, |(_, t)| t.bits()),
            _ => 64,
        }
    }

    fn src(&self, o: &Opnd<'a>, ty: Ty) -> Result<Src, ParseError> {
        match o {
            Opnd::Name(n) => {
                if let Some((r, _)) = reg_of(self.fs, n) {
                    return Ok(Src::Reg(r));
                }
                if let Some(s) = sreg(n) {
                    return Ok(Src::Sreg(s));
                }
                if let Some(v) = self.var(n) {
                    return Ok(Src::Imm(self.var_addr(v, false)));
                }
                if *n == "WARP_SZ" {
                    return Ok(Src::Imm(32));
                }
                self.err(format!("undefined register or variable '{n}'"))
            }
            o => match imm_bits(o, ty) {
                Some(b) => Ok(Src::Imm(b)),
                None => self.err("bad operand"),
            },
        }
    }

    /// Records that the function names the shared variable at `off`.
    fn note_shared(&self, off: u32) {
        self.fs.shared_vars.borrow_mut().insert(off);
    }

    /// A variable's address in its own space (`generic` asks for the
    /// generic address).
    fn var_addr(&self, v: VarLoc, generic: bool) -> u64 {
        match v {
            VarLoc::Shared(u32::MAX) if generic => SHARED_WINDOW + EXTERN_SHARED as u64,
            VarLoc::Shared(u32::MAX) => EXTERN_SHARED as u64,
            VarLoc::Shared(o) if generic => {
                self.note_shared(o);
                SHARED_WINDOW + o as u64
            }
            VarLoc::Shared(o) => {
                self.note_shared(o);
                o as u64
            }
            VarLoc::Local(o) if generic => LOCAL_WINDOW + o as u64,
            VarLoc::Local(o) | VarLoc::KParam(o) | VarLoc::Param(o) => o as u64,
            VarLoc::Static(o) => STATIC_WINDOW + o as u64,
        }
    }

    fn addr(&self, o: &Opnd<'a>, space: Space) -> Result<(Addr, Space), ParseError> {
        let Opnd::Addr(base, off) = o else {
            return self.err("expected an address [..]");
        };
        let kp = |s: Space| {
            if s == Space::Param && self.fs.entry {
                Space::KParam
            } else {
                s
            }
        };
        match base {
            None => Ok((
                Addr {
                    base: None,
                    off: *off,
                },
                kp(space),
            )),
            Some(n) => {
                if let Some((r, _)) = reg_of(self.fs, n) {
                    return Ok((
                        Addr {
                            base: Some(r),
                            off: *off,
                        },
                        kp(space),
                    ));
                }
                let Some(v) = self.var(n) else {
                    return self.err(format!("undefined variable or register '{n}'"));
                };
                let space = match (space, v) {
                    (Space::Param, VarLoc::KParam(_)) => Space::KParam,
                    (Space::Param, VarLoc::Param(_)) => Space::Param,
                    (Space::Param, _) => return self.err(format!("'{n}' is not a parameter")),
                    (s, _) => s,
                };
                let a = self.var_addr(v, space == Space::Generic) as i64;
                Ok((
                    Addr {
                        base: None,
                        off: a.wrapping_add(*off),
                    },
                    space,
                ))
            }
        }
    }

    fn decode(&mut self, opcode: &'a str, o: &[Opnd<'a>]) -> Result<Op, ParseError> {
        // (An instruction of the PTX ISA this executor does not run refuses
        // the kernels that reach it; a name that is none is malformed PTX.)
        let mut parts = opcode.split('.');
        let base = parts.next().unwrap_or("");
        let m = Mods {
            base,
            list: parts.collect(),
        };
        let types = m.types();
        let ty = types.last().copied();
        let need = |n: usize| -> Result<(), ParseError> {
            if o.len() != n {
                return self.err(format!("{opcode} takes {n} operands, {} given", o.len()));
            }
            Ok(())
        };
        // Packed types (`.f16x2`, `.u16x2`, ...) the arms below do not
        // take are valid PTX this executor does not run.
        let packed_ty = m
            .list
            .iter()
            .any(|x| x.ends_with("x2") || x.ends_with("x4"));
        let need_ty = || match ty {
            Some(t) => Ok(t),
            None if packed_ty => self.unsup(format!("{opcode}: packed types are not supported")),
            None => self.err(format!("{opcode}: missing type")),
        };
        let half = if m.has("f16x2") {
            Some((Ty::F16, 2))
        } else if m.has("bf16x2") {
            Some((Ty::Bf16, 2))
        } else {
            ty.filter(|t| matches!(t, Ty::F16 | Ty::Bf16) && types.len() == 1)
                .map(|t| (t, 1))
        };
        if let (Some((hty, lanes)), Some(op)) = (half, half_op(m.base)) {
            return self.half(&m, opcode, o, op, hty, lanes);
        }
        Ok(match m.base {
            "mov" => {
                need(2)?;
                let t = need_ty()?;
                match (&o[0], &o[1]) {
                    (Opnd::Vec(_), Opnd::Vec(_)) => return self.err("mov of vector to vector"),
                    (d, Opnd::Vec(parts)) => {
                        let parts = parts
                            .iter()
                            .map(|p| self.src(p, Ty::B64))
                            .collect::<Result<Vec<_>, _>>()?;
                        if parts.is_empty() || t.bits() % parts.len() as u32 != 0 {
                            return self.err("bad vector pack");
                        }
                        Op::Pack {
                            bits: t.bits() / parts.len() as u32,
                            d: self.dst(d)?,
                            parts,
                        }
                    }
                    (Opnd::Vec(ds), a) => {
                        let d = ds
                            .iter()
                            .map(|p| {
                                if matches!(p, Opnd::Name("_")) {
                                    Ok(None)
                                } else {
                                    self.dst(p).map(Some)
                                }
                            })
                            .collect::<Result<Vec<_>, _>>()?;
                        if d.is_empty() || t.bits() % d.len() as u32 != 0 {
                            return self.err("bad vector unpack");
                        }
                        Op::Unpack {
                            bits: t.bits() / d.len() as u32,
                            d,
                            a: self.src(a, t)?,
                        }
                    }
                    (d, a) => Op::Un {
                        op: UnOp::Mov,
                        ty: t,
                        d: self.dst(d)?,
                        a: self.src(a, t)?,
                    },
                }
            }
            "add" | "sub" | "mad" | "addc" | "subc" | "madc"
                if m.has("cc") || m.base.ends_with('c') =>
            {
                let mad = m.base.starts_with("mad");
                need(if mad { 4 } else { 3 })?;
                let t = need_ty()?;
                if !matches!(t.bits(), 32 | 64) || t.float() {
                    return self.err("carry arithmetic takes 32- or 64-bit integers");
                }
                let op = match (&m.base[..3], m.has("hi")) {
                    ("add", _) => CarryOp::Add,
                    ("sub", _) => CarryOp::Sub,
                    (_, true) => CarryOp::MadHi,
                    (_, false) => CarryOp::MadLo,
                };
                let (d, [a, b]) = self.dst_srcs(o, [t, t])?;
                let c = if mad {
                    self.src(&o[3], t)?
                } else {
                    Src::Imm(0)
                };
                Op::Carry {
                    op,
                    ty: t,
                    cin: m.base.ends_with('c'),
                    cout: m.has("cc"),
                    d,
                    a,
                    b,
                    c,
                }
            }
            "redux" => {
                need(3)?;
                let t = need_ty()?;
                let Some(op) = m.find(&[
                    ("add", BinOp::Add),
                    ("min", BinOp::Min),
                    ("max", BinOp::Max),
                    ("and", BinOp::And),
                    ("or", BinOp::Or),
                    ("xor", BinOp::Xor),
                ]) else {
                    return self.err("redux: unknown operation");
                };
                if t.float() || t.bits() != 32 {
                    return self.err("redux takes 32-bit integers");
                }
                let (d, [a]) = self.dst_srcs(o, [t])?;
                Op::Redux { op, ty: t, d, a }
            }
            "match" => {
                need(3)?;
                let t = need_ty()?;
                let (d, dp) = self.dst_pred(&o[0])?;
                Op::Match {
                    all: m.has("all"),
                    bits: t.bits(),
                    d,
                    dp,
                    a: self.src(&o[1], t)?,
                }
            }
            "elect" => {
                need(2)?;
                let (d, dp) = self.dst_pred(&o[0])?;
                Op::Elect { d, dp }
            }
            "isspacep" => {
                need(2)?;
                Op::Isspacep {
                    space: m.space(),
                    d: self.pred_dst_o(&o[0])?.unwrap_or(self.sink),
                    a: self.src(&o[1], Ty::U64)?,
                }
            }
            "add" | "sub" | "mul" | "div" | "rem" | "min" | "max" | "and" | "or" | "xor"
            | "shl" | "shr" | "copysign" | "mul24" => {
                need(3)?;
                let t = need_ty()?;
                let b_ty = if matches!(m.base, "shl" | "shr") {
                    Ty::U32
                } else {
                    t
                };
                let (d, [a, b]) = self.dst_srcs(o, [t, b_ty])?;
                if m.has("NaN") || m.has("xorsign") {
                    return self.unsup(format!("{opcode}: .NaN and .xorsign are not supported"));
                }
                if m.base == "mul" && m.has("wide") {
                    return Ok(Op::MulWide { ty: t, d, a, b });
                }
                let op = match (m.base, m.has("hi"), m.has("sat")) {
                    ("add", _, true) if !t.float() => BinOp::AddSat,
                    ("sub", _, true) if !t.float() => BinOp::SubSat,
                    ("add", ..) => BinOp::Add,
                    ("sub", ..) => BinOp::Sub,
                    ("mul", true, _) => BinOp::MulHi,
                    ("mul", ..) => BinOp::MulLo,
                    ("mul24", true, _) => BinOp::Mul24Hi,
                    ("mul24", ..) => BinOp::Mul24Lo,
                    ("div", ..) => BinOp::Div,
                    ("rem", ..) => BinOp::Rem,
                    ("min", ..) => BinOp::Min,
                    ("max", ..) => BinOp::Max,
                    ("and", ..) => BinOp::And,
                    ("or", ..) => BinOp::Or,
                    ("xor", ..) => BinOp::Xor,
                    ("shl", ..) => BinOp::Shl,
                    ("shr", ..) => BinOp::Shr,
                    _ => BinOp::Copysign,
                };
                if let Some(fx) = self.fx(&m, FxOp::Bin(op), t, d, a, b, Src::Imm(0))? {
                    return Ok(fx);
                }
                Op::Bin { op, ty: t, d, a, b }
            }
            "not" | "cnot" | "neg" | "abs" | "popc" | "clz" | "brev" | "rcp" | "sqrt" | "rsqrt"
            | "ex2" | "lg2" | "sin" | "cos" | "tanh" | "bfind" => {
                need(2)?;
                let t = need_ty()?;
                let op = match m.base {
                    "not" => UnOp::Not,
                    "cnot" => UnOp::Cnot,
                    "neg" => UnOp::Neg,
                    "abs" => UnOp::Abs,
                    "popc" => UnOp::Popc,
                    "clz" => UnOp::Clz,
                    "brev" => UnOp::Brev,
                    "rcp" => UnOp::Rcp,
                    "sqrt" => UnOp::Sqrt,
                    "rsqrt" => UnOp::Rsqrt,
                    "ex2" => UnOp::Ex2,
                    "lg2" => UnOp::Lg2,
                    "sin" => UnOp::Sin,
                    "cos" => UnOp::Cos,
                    "bfind" if m.has("shiftamt") => UnOp::BfindShift,
                    "bfind" => UnOp::Bfind,
                    _ => UnOp::Tanh,
                };
                let (d, [a]) = self.dst_srcs(o, [t])?;
                if let Some(fx) = self.fx(&m, FxOp::Un(op), t, d, a, Src::Imm(0), Src::Imm(0))? {
                    return Ok(fx);
                }
                Op::Un { op, ty: t, d, a }
            }
            "mad" | "fma" | "mad24" => {
                need(4)?;
                let t = need_ty()?;
                let op = if m.base == "mad24" {
                    if m.has("hi") {
                        return self.unsup("mad24.hi is not supported");
                    }
                    MadOp::Mad24Lo
                } else if t.float() {
                    MadOp::Fma
                } else {
                    m.pick(&[("wide", MadOp::Wide), ("hi", MadOp::Hi)])
                        .unwrap_or(MadOp::Lo)
                };
                if m.has("cc") {
                    return self.err("carry arithmetic (.cc) is not supported");
                }
                let cty = if op == MadOp::Wide { wide(t) } else { t };
                let (d, [a, b, c]) = self.dst_srcs(o, [t, t, cty])?;
                if op == MadOp::Fma {
                    if let Some(fx) = self.fx(&m, FxOp::Fma, t, d, a, b, c)? {
                        return Ok(fx);
                    }
                }
                Op::Mad {
                    op,
                    ty: t,
                    d,
                    a,
                    b,
                    c,
                }
            }
            "setp" => {
                if o.len() != 3 && o.len() != 4 {
                    return self.err("setp takes 3 or 4 operands");
                }
                let t = need_ty()?;
                let cmp = self.cmp(m.list.first().copied().unwrap_or(""))?;
                let (d, d2) = match &o[0] {
                    Opnd::Pair(a, b) => (self.pred_dst(a)?, self.pred_dst(b)?),
                    x => (self.pred_dst_o(x)?, None),
                };
                let comb = if o.len() == 4 {
                    let bops = [
                        ("and", BoolOp::And),
                        ("or", BoolOp::Or),
                        ("xor", BoolOp::Xor),
                    ];
                    let Some(bop) = m.pick(&bops) else {
                        return self.err("setp with 4 operands needs .and/.or/.xor");
                    };
                    let (c, neg) = self.pred_src(&o[3])?;
                    Some((bop, c, neg))
                } else {
                    None
                };
                Op::Setp {
                    cmp,
                    ty: t,
                    d,
                    d2,
                    a: self.src(&o[1], t)?,
                    b: self.src(&o[2], t)?,
                    comb,
                }
            }
            "set" => {
                // set.CmpOp{.BoolOp}{.ftz}.dtype.stype d, a, b{, {!}c}
                if o.len() != 3 && o.len() != 4 {
                    return self.err("set takes 3 or 4 operands");
                }
                let names: Vec<&str> = m
                    .list
                    .iter()
                    .copied()
                    .filter(|x| Ty::from_name(x).is_some() || x.ends_with("16x2"))
                    .collect();
                let &[dname, sname] = names.as_slice() else {
                    return self.err("set needs a destination and a source type");
                };
                let half_pair = |x: &str| match x {
                    "f16x2" => Some(Ty::F16),
                    "bf16x2" => Some(Ty::Bf16),
                    _ => None,
                };
                let (sty, packed) = match half_pair(sname) {
                    Some(t) => (t, true),
                    None => (self.require_ty(sname)?, false),
                };
                let dty = match half_pair(dname) {
                    Some(t) if packed => t,
                    Some(_) => return self.err("set: a packed result needs packed operands"),
                    None => self.require_ty(dname)?,
                };
                let cmp = self.cmp(m.list.first().copied().unwrap_or(""))?;
                let comb = if o.len() == 4 {
                    let Some(bop) = m.pick(&[
                        ("and", BoolOp::And),
                        ("or", BoolOp::Or),
                        ("xor", BoolOp::Xor),
                    ]) else {
                        return self.err("set with 4 operands needs .and/.or/.xor");
                    };
                    let (c, neg) = self.pred_src(&o[3])?;
                    Some((bop, c, neg))
                } else {
                    None
                };
                let src_ty = if packed { Ty::B32 } else { sty };
                let (d, [a, b]) = self.dst_srcs(o, [src_ty, src_ty])?;
                Op::Set {
                    cmp,
                    sty,
                    dty,
                    packed,
                    comb,
                    d,
                    a,
                    b,
                }
            }
            "selp" => {
                need(4)?;
                let t = need_ty()?;
                let (d, [a, b]) = self.dst_srcs(o, [t, t])?;
                let c = self.pred_src(&o[3])?.0;
                Op::Selp { ty: t, d, a, b, c }
            }
            "cvt" => {
                if let (3, Some((hty, 2)), [Ty::F32]) = (o.len(), half, types.as_slice()) {
                    if m.rnd() != Rnd::Rn || m.has("satfinite") {
                        return self.unsup("only cvt.rn{.relu} packs floats into half pairs");
                    }
                    let (d, [a, b]) = self.dst_srcs(o, [Ty::F32, Ty::F32])?;
                    return Ok(Op::CvtPack {
                        ty: hty,
                        relu: m.has("relu"),
                        d,
                        a,
                        b,
                    });
                }
                if packed_ty {
                    return self.unsup("packed cvt is not supported");
                }
                need(2)?;
                if types.len() != 2 {
                    return self.err("cvt needs a destination and a source type");
                }
                Op::Cvt {
                    dty: types[0],
                    sty: types[1],
                    rnd: m.rnd(),
                    sat: m.has("sat"),
                    ftz: m.has("ftz"),
                    dbits: self.dst_bits(&o[0]),
                    d: self.dst(&o[0])?,
                    a: self.src(&o[1], types[1])?,
                }
            }
            "cvta" => {
                need(2)?;
                let space = m.space();
                Op::Cvta {
                    to: m.has("to"),
                    space,
                    d: self.dst(&o[0])?,
                    a: self.src(&o[1], Ty::U64)?,
                }
            }
            "ld" | "ldu" => {
                need(2)?;
                let t = need_ty()?;
                let n = m.vec();
                let (addr, space) = self.addr(&o[1], m.space())?;
                let mut d = [self.sink; 4];
                let dbits;
                match &o[0] {
                    Opnd::Vec(v) if v.len() == n as usize && n > 1 => {
                        for (i, x) in v.iter().enumerate() {
                            d[i] = self.dst(x)?;
                        }
                        dbits = self.dst_bits(&v[0]);
                    }
                    x if n == 1 => {
                        d[0] = self.dst(x)?;
                        dbits = self.dst_bits(x);
                    }
                    _ => return self.err("vector width does not match the operands"),
                }
                Op::Ld {
                    space,
                    ty: t,
                    n,
                    d,
                    dbits,
                    addr,
                }
            }
            "st" => {
                need(2)?;
                let t = need_ty()?;
                let n = m.vec();
                let (addr, space) = self.addr(&o[0], m.space())?;
                if space == Space::KParam {
                    return self.err("kernel parameters are read-only");
                }
                let mut v = [Src::Imm(0); 4];
                match &o[1] {
                    Opnd::Vec(x) if x.len() == n as usize && n > 1 => {
                        for (i, s) in x.iter().enumerate() {
                            v[i] = self.src(s, t)?;
                        }
                    }
                    x if n == 1 => v[0] = self.src(x, t)?,
                    _ => return self.err("vector width does not match the operands"),
                }
                Op::St {
                    space,
                    ty: t,
                    n,
                    v,
                    addr,
                }
            }
            "atom" | "red" => {
                let packed_half = if m.has("f16x2") {
                    Some(AtomTy::F16x2)
                } else if m.has("bf16x2") {
                    Some(AtomTy::Bf16x2)
                } else {
                    None
                };
                if let Some(aty) = packed_half {
                    if !m.has("add") || m.vec() != 1 {
                        return self.unsup(format!("{opcode}: only add of half pairs"));
                    }
                    let red = m.base == "red";
                    let k = usize::from(!red);
                    need(k + 2)?;
                    let d = if red { None } else { Some(self.dst(&o[0])?) };
                    let (addr, space) = self.addr(&o[k], m.space())?;
                    if !matches!(space, Space::Global | Space::Shared | Space::Generic) {
                        return self.err("atomics only on global, shared or generic addresses");
                    }
                    return Ok(Op::Atom {
                        space,
                        op: AtomicOp {
                            kind: AtomKind::Add,
                            ty: aty,
                        },
                        d,
                        addr,
                        b: self.src(&o[k + 1], Ty::B32)?,
                        c: Src::Imm(0),
                    });
                }
                let t = need_ty()?;
                let Some(kind) = m.find(&[
                    ("add", AtomKind::Add),
                    ("min", AtomKind::Min),
                    ("max", AtomKind::Max),
                    ("exch", AtomKind::Exch),
                    ("cas", AtomKind::Cas),
                    ("and", AtomKind::And),
                    ("or", AtomKind::Or),
                    ("xor", AtomKind::Xor),
                    ("inc", AtomKind::Inc),
                    ("dec", AtomKind::Dec),
                ]) else {
                    return self.err(format!("{opcode}: unknown operation"));
                };
                let aty = match t {
                    Ty::U32 | Ty::B32 => AtomTy::U32,
                    Ty::S32 => AtomTy::S32,
                    Ty::U64 | Ty::B64 => AtomTy::U64,
                    Ty::S64 => AtomTy::S64,
                    Ty::F32 => AtomTy::F32,
                    Ty::F64 => AtomTy::F64,
                    _ => return self.unsup(format!("{opcode}: unsupported type")),
                };
                let red = m.base == "red";
                let k = if red { 0 } else { 1 };
                let nops = k + 2 + usize::from(kind == AtomKind::Cas);
                need(nops)?;
                let d = if red { None } else { Some(self.dst(&o[0])?) };
                let (addr, space) = self.addr(&o[k], m.space())?;
                if !matches!(space, Space::Global | Space::Shared | Space::Generic) {
                    return self.err("atomics only on global, shared or generic addresses");
                }
                let b = self.src(&o[k + 1], t)?;
                let c = if kind == AtomKind::Cas {
                    self.src(&o[k + 2], t)?
                } else {
                    Src::Imm(0)
                };
                Op::Atom {
                    space,
                    op: AtomicOp { kind, ty: aty },
                    d,
                    addr,
                    b,
                    c,
                }
            }
            "shfl" => {
                let Some(mode) = m.pick(&[
                    ("up", ShflMode::Up),
                    ("down", ShflMode::Down),
                    ("bfly", ShflMode::Bfly),
                    ("idx", ShflMode::Idx),
                ]) else {
                    return self.err("shfl: unknown mode");
                };
                let want = if m.has("sync") { 5 } else { 4 };
                need(want)?;
                let (d, dp) = self.dst_pred(&o[0])?;
                let [a, b, c] = self.srcs(&o[1..], [Ty::B32; 3])?;
                Op::Shfl {
                    mode,
                    d,
                    dp,
                    a,
                    b,
                    c,
                }
            }
            "vote" => {
                let Some(mode) = m.pick(&[
                    ("all", VoteMode::All),
                    ("any", VoteMode::Any),
                    ("uni", VoteMode::Uni),
                    ("ballot", VoteMode::Ballot),
                ]) else {
                    return self.err("vote: unknown mode");
                };
                let want = if m.has("sync") { 3 } else { 2 };
                need(want)?;
                let (a, neg) = self.pred_src(&o[1])?;
                Op::Vote {
                    mode,
                    d: self.dst(&o[0])?,
                    a,
                    neg,
                }
            }
            "activemask" => {
                need(1)?;
                Op::Activemask {
                    d: self.dst(&o[0])?,
                }
            }
            "bfe" => {
                need(4)?;
                let t = need_ty()?;
                let (d, [a, b, c]) = self.dst_srcs(o, [t, Ty::U32, Ty::U32])?;
                Op::Bfe { ty: t, d, a, b, c }
            }
            "bfi" => {
                need(5)?;
                let t = need_ty()?;
                let (d, [a, b, c, e]) = self.dst_srcs(o, [t, t, Ty::U32, Ty::U32])?;
                Op::Bfi {
                    ty: t,
                    d,
                    a,
                    b,
                    c,
                    e,
                }
            }
            "prmt" => {
                need(4)?;
                if m.list
                    .iter()
                    .any(|x| matches!(*x, "f4e" | "b4e" | "rc8" | "ecl" | "ecr" | "rc16"))
                {
                    return self.unsup("prmt modes are not supported");
                }
                let (d, [a, b, c]) = self.dst_srcs(o, [Ty::B32; 3])?;
                Op::Prmt { d, a, b, c }
            }
            "lop3" => {
                need(5)?;
                let lut = match &o[4] {
                    Opnd::Int(v) if (0..=255).contains(v) => *v as u8,
                    _ => return self.err("lop3: the table must be a literal 0..255"),
                };
                let (d, [a, b, c]) = self.dst_srcs(o, [Ty::B32; 3])?;
                Op::Lop3 { d, a, b, c, lut }
            }
            "shf" => {
                need(4)?;
                let (d, [a, b, c]) = self.dst_srcs(o, [Ty::B32, Ty::B32, Ty::U32])?;
                Op::Shf {
                    left: m.has("l"),
                    wrap: m.has("wrap"),
                    d,
                    a,
                    b,
                    c,
                }
            }
            "testp" => {
                need(2)?;
                let t = need_ty()?;
                let op = match m.list.first().copied().unwrap_or("") {
                    "finite" => TestOp::Finite,
                    "infinite" => TestOp::Infinite,
                    "number" => TestOp::Number,
                    "notanumber" => TestOp::NotANumber,
                    "normal" => TestOp::Normal,
                    "subnormal" => TestOp::Subnormal,
                    x => return self.err(format!("testp: unknown property '{x}'")),
                };
                Op::Testp {
                    op,
                    ty: t,
                    d: self.pred_dst_o(&o[0])?.unwrap_or(self.sink),
                    a: self.src(&o[1], t)?,
                }
            }
            "bra" | "brx" => {
                if m.base == "brx" {
                    return self.unsup("brx.idx is not supported");
                }
                need(1)?;
                let Opnd::Name(l) = o[0] else {
                    return self.err("bra needs a label");
                };
                self.fs.fix.push((self.at, l, self.line));
                Op::Bra { target: 0 }
            }
            "call" => self.call(o)?,
            "ret" => Op::Ret,
            "exit" => Op::Exit,
            "trap" => Op::Trap,
            "tex" | "suld" | "sust" | "txq" | "suq" => self.texture(&m, o)?,
            "bar" | "barrier" if m.has("red") => {
                // bar.red.popc.u32 d, a{, b}, {!}c; bar.red.and/or.pred p, ...
                if o.len() != 3 && o.len() != 4 {
                    return self.err(format!("{opcode} takes 3 or 4 operands"));
                }
                let Some(op) = m.pick(&[
                    ("popc", BarRedOp::Popc),
                    ("and", BarRedOp::And),
                    ("or", BarRedOp::Or),
                ]) else {
                    return self.err(format!("{opcode}: unknown reduction"));
                };
                let d = if op == BarRedOp::Popc {
                    self.dst(&o[0])?
                } else {
                    self.pred_dst_o(&o[0])?.unwrap_or(self.sink)
                };
                let (c, neg) = self.pred_src(&o[o.len() - 1])?;
                Op::BarRed { op, d, c, neg }
            }
            "bmsk" => {
                need(3)?;
                let Some(clamp) = m.pick(&[("clamp", true), ("wrap", false)]) else {
                    return self.err("bmsk needs .clamp or .wrap");
                };
                let (d, [a, b]) = self.dst_srcs(o, [Ty::U32, Ty::U32])?;
                Op::Bmsk { clamp, d, a, b }
            }
            "bar" | "barrier" => {
                if m.has("warp") {
                    Op::Nop
                } else if m.has("arrive") {
                    return self.unsup(format!("{opcode} is not supported"));
                } else {
                    // bar.sync a{, b}: every barrier is the whole block's
                    // (named barriers with thread counts are treated alike).
                    Op::Bar
                }
            }
            "membar" | "fence" | "prefetch" | "prefetchu" | "nanosleep" | "pmevent" | "brkpt"
            | "griddepcontrol" | "discard" | "applypriority" => Op::Nop,
            b if PTX_INSTRUCTIONS.contains(&b) => {
                return self.unsup(format!("unsupported instruction '{opcode}'"))
            }
            // No PTX instruction has that name: the module is malformed,
            // as NVIDIA's compiler says of it.
            _ => return self.err(format!("unknown instruction '{opcode}'")),
        })
    }

    /// The type a modifier names (without its dot).
    fn require_ty(&self, name: &str) -> Result<Ty, ParseError> {
        Ty::from_name(name).map_or_else(|| self.err(format!("unknown type '.{name}'")), Ok)
    }

    /// A comparison's modifier (`eq`, `ltu`, ...).
    fn cmp(&self, name: &str) -> Result<Cmp, ParseError> {
        Ok(match name {
            "eq" => Cmp::Eq,
            "ne" => Cmp::Ne,
            "lt" => Cmp::Lt,
            "le" => Cmp::Le,
            "gt" => Cmp::Gt,
            "ge" => Cmp::Ge,
            "lo" => Cmp::Lo,
            "ls" => Cmp::Ls,
            "hi" => Cmp::Hi,
            "hs" => Cmp::Hs,
            "equ" => Cmp::Equ,
            "neu" => Cmp::Neu,
            "ltu" => Cmp::Ltu,
            "leu" => Cmp::Leu,
            "gtu" => Cmp::Gtu,
            "geu" => Cmp::Geu,
            "num" => Cmp::Num,
            "nan" => Cmp::Nan,
            c => return self.err(format!("unknown comparison '{c}'")),
        })
    }

    /// Half-precision arithmetic: `op` on `lanes` values of `ty`.
    fn half(
        &self,
        m: &Mods<'_>,
        opcode: &str,
        o: &[Opnd<'a>],
        op: HalfOp,
        ty: Ty,
        lanes: u8,
    ) -> Result<Op, ParseError> {
        let n = match op {
            HalfOp::Fma => 4,
            HalfOp::Neg | HalfOp::Abs => 2,
            _ => 3,
        };
        if o.len() != n {
            return self.err(format!("{opcode} takes {n} operands, {} given", o.len()));
        }
        if !matches!(m.rnd(), Rnd::Rn | Rnd::Default) {
            return self.err(format!(
                "{opcode}: half-precision arithmetic rounds to nearest"
            ));
        }
        if m.has("NaN") || m.has("xorsign") || m.has("oob") {
            return self.unsup(format!(
                "{opcode}: .NaN, .xorsign and .oob are not supported"
            ));
        }
        // Packed pairs are bit patterns in 32-bit registers.
        let sty = if lanes == 2 { Ty::B32 } else { ty };
        let d = self.dst(&o[0])?;
        let mut src = [Src::Imm(0); 3];
        for (s, x) in src.iter_mut().zip(&o[1..]) {
            *s = self.src(x, sty)?;
        }
        let [a, b, c] = src;
        Ok(Op::Half {
            op,
            ty,
            lanes,
            ftz: m.has("ftz") && ty == Ty::F16,
            sat: m.has("sat"),
            relu: m.has("relu"),
            d,
            a,
            b,
            c,
        })
    }

    /// The slow-path form of a float operation whose modifiers need it.
    #[allow(clippy::too_many_arguments)]
    fn fx(
        &self,
        m: &Mods<'_>,
        op: FxOp,
        ty: Ty,
        d: u32,
        a: Src,
        b: Src,
        c: Src,
    ) -> Result<Option<Op>, ParseError> {
        if !ty.float() {
            return Ok(None);
        }
        let rnd = match m.rnd() {
            r @ (Rnd::Rz | Rnd::Rm | Rnd::Rp) => r,
            _ => Rnd::Rn,
        };
        let ftz = m.has("ftz") && ty == Ty::F32;
        let sat = m.has("sat");
        if rnd == Rnd::Rn && !ftz && !sat {
            return Ok(None);
        }
        if rnd != Rnd::Rn {
            let directed = matches!(
                op,
                FxOp::Bin(BinOp::Add | BinOp::Sub | BinOp::MulLo | BinOp::Div)
                    | FxOp::Un(UnOp::Sqrt | UnOp::Rcp)
                    | FxOp::Fma
            );
            if !directed || !matches!(ty, Ty::F32 | Ty::F64) || (op == FxOp::Fma && ty == Ty::F64) {
                return self
                    .unsup("this rounding mode is not supported for this operation and type");
            }
        }
        Ok(Some(Op::Fx {
            op,
            ty,
            rnd,
            ftz,
            sat,
            d,
            a,
            b,
            c,
        }))
    }

    fn pred_dst(&self, n: &str) -> Result<Option<u32>, ParseError> {
        if n == "_" {
            return Ok(None);
        }
        match reg_of(self.fs, n) {
            Some((r, Ty::Pred)) => Ok(Some(r)),
            Some(_) => self.err(format!("'{n}' is not a predicate")),
            None => self.err(format!("undefined predicate '{n}'")),
        }
    }

    fn pred_dst_o(&self, o: &Opnd<'a>) -> Result<Option<u32>, ParseError> {
        match o {
            Opnd::Name(n) => self.pred_dst(n),
            _ => self.err("expected a predicate"),
        }
    }

    fn pred_src(&self, o: &Opnd<'a>) -> Result<(Src, bool), ParseError> {
        match o {
            Opnd::Not(n) => Ok((self.src(&Opnd::Name(n), Ty::Pred)?, true)),
            Opnd::Int(v) => Ok((Src::Imm((*v != 0) as u64), false)),
            o => Ok((self.src(o, Ty::Pred)?, false)),
        }
    }

    /// The object operand of a texture or surface instruction: a
    /// register holding a handle (texture and surface references, named
    /// module variables, are not run here).
    fn object(&self, name: &str) -> Result<Src, ParseError> {
        match reg_of(self.fs, name) {
            Some((r, _)) => Ok(Src::Reg(r)),
            None => self.unsup(format!(
                "'{name}': texture and surface references are not supported, objects are"
            )),
        }
    }

    /// `tex`, `suld.b`, `sust.b`, `txq`, `suq`.
    fn texture(&mut self, m: &Mods<'a>, o: &[Opnd<'a>]) -> Result<Op, ParseError> {
        use crate::texture::{Query, SurfaceMode};
        if m.base == "txq" || m.base == "suq" {
            let [d, Opnd::Addr(Some(h), 0)] = o else {
                return self.err(format!("{}: expected d, [object]", m.base));
            };
            let Some(query) = m.find(&[
                ("width", Query::Width),
                ("height", Query::Height),
                ("depth", Query::Depth),
                ("channel_data_type", Query::ChannelType),
                ("channel_order", Query::ChannelOrder),
                ("normalized_coords", Query::NormalizedCoords),
                ("filter_mode", Query::FilterMode),
                ("array_size", Query::ArraySize),
            ]) else {
                return self.unsup(format!("{}: this query is not supported", m.base));
            };
            return Ok(Op::Txq {
                surface: m.base == "suq",
                query,
                d: self.dst(d)?,
                handle: self.object(h)?,
            });
        }
        let Some(geom) = m.find(&[
            ("1d", Geom::D1),
            ("2d", Geom::D2),
            ("3d", Geom::D3),
            ("a1d", Geom::A1),
            ("a2d", Geom::A2),
            ("cube", Geom::Cube),
            ("acube", Geom::ACube),
        ]) else {
            return self.unsup(format!(
                "{}: only 1d, 2d, 3d, a1d, a2d, cube and acube geometries are supported",
                m.base
            ));
        };
        if geom.cube() && m.base != "tex" {
            return self.unsup(format!("{}: cubemap surfaces are a2d", m.base));
        }
        if m.list
            .iter()
            .any(|x| matches!(*x, "level" | "grad" | "base"))
            || o.len() != 2
        {
            return self.unsup(format!(
                "{}: mipmap levels, gradients, offsets and depth compares are not supported",
                m.base
            ));
        }
        let (bracket, other) = if m.base == "sust" {
            (&o[0], &o[1])
        } else {
            (&o[1], &o[0])
        };
        let Opnd::Bracket(h, coords) = bracket else {
            return self.err(format!("{}: expected [object, coordinates]", m.base));
        };
        let handle = self.object(h)?;
        let types = m.types();
        let coord_list: &[Opnd<'a>] = match coords.as_slice() {
            [Opnd::Vec(v)] => v,
            one @ [_] => one,
            _ => return self.err(format!("{}: expected one coordinate vector", m.base)),
        };
        if coord_list.len() != geom.operands() && coord_list.len() != geom.dims() {
            return self.err(format!(
                "{}: {} coordinates for this geometry",
                m.base,
                coord_list.len()
            ));
        }
        let int_coords = match m.base {
            "tex" => {
                let [dty, cty] = types[..] else {
                    return self.err("tex needs a result and a coordinate type");
                };
                if !matches!(dty, Ty::F32 | Ty::S32 | Ty::U32) || m.vec() != 4 {
                    return self.unsup("tex: only .v4 results of .f32, .s32 or .u32");
                }
                match cty {
                    Ty::F32 => false,
                    Ty::S32 if !geom.cube() => true,
                    _ => return self.err("tex: coordinates are .f32 or .s32 (.f32 for cubes)"),
                }
            }
            _ => true,
        };
        let mut c = [Src::Imm(0); 4];
        for (i, x) in coord_list.iter().enumerate() {
            let layer = geom.layered() && i == 0;
            c[i] = self.src(
                x,
                if int_coords || layer {
                    Ty::S32
                } else {
                    Ty::F32
                },
            )?;
        }
        let vector = |p: &Self, n: u8, o: &Opnd<'a>| -> Result<Vec<Opnd<'a>>, ParseError> {
            match o {
                Opnd::Vec(v) if v.len() == n as usize => Ok(v.clone()),
                x if n == 1 => Ok(vec![x.clone()]),
                _ => p.err("vector width does not match the operands"),
            }
        };
        if m.base == "tex" {
            let mut d = [self.sink; 4];
            for (i, x) in vector(self, 4, other)?.iter().enumerate() {
                d[i] = self.dst(x)?;
            }
            return Ok(Op::Tex {
                geom,
                int_coords,
                d,
                handle,
                c,
            });
        }
        if !m.has("b") {
            return self.unsup(format!("{}: only the .b form is supported", m.base));
        }
        let mode = m
            .find(&[
                ("trap", SurfaceMode::Trap),
                ("clamp", SurfaceMode::Clamp),
                ("zero", SurfaceMode::Zero),
            ])
            .unwrap_or(SurfaceMode::Trap);
        let Some(&ty) = types.last() else {
            return self.err(format!("{}: missing type", m.base));
        };
        if !matches!(ty, Ty::B8 | Ty::B16 | Ty::B32 | Ty::B64) {
            return self.err(format!("{}.b takes .b8, .b16, .b32 or .b64", m.base));
        }
        let n = m.vec();
        let vals = vector(self, n, other)?;
        if m.base == "suld" {
            let mut d = [self.sink; 4];
            for (i, x) in vals.iter().enumerate() {
                d[i] = self.dst(x)?;
            }
            return Ok(Op::Suld {
                geom,
                ty,
                n,
                mode,
                d,
                handle,
                c,
            });
        }
        let mut v = [Src::Imm(0); 4];
        for (i, x) in vals.iter().enumerate() {
            v[i] = self.src(x, ty)?;
        }
        Ok(Op::Sust {
            geom,
            ty,
            n,
            mode,
            v,
            handle,
            c,
        })
    }

    /// `call (ret), f, (args)`, `call f, (args)`, `call f`.
    fn call(&mut self, o: &[Opnd<'a>]) -> Result<Op, ParseError> {
        let mut it = o.iter().peekable();
        let mut ret = None;
        if let Some(Opnd::List(r)) = it.peek() {
            if r.len() > 1 {
                return self.err("at most one return value");
            }
            if let Some(x) = r.first() {
                ret = Some(self.param_var(x)?);
            }
            it.next();
        }
        let Some(Opnd::Name(f)) = it.next() else {
            return self.err("call needs a function name");
        };
        let mut args = Vec::new();
        if let Some(Opnd::List(a)) = it.next() {
            for x in a {
                args.push(self.param_var(x)?);
            }
        }
        if it.next().is_some() {
            return self.unsup("indirect calls are not supported");
        }
        self.call_fix.push((self.at, f, self.line));
        Ok(Op::Call { func: 0, args, ret })
    }

    fn param_var(&self, o: &Opnd<'a>) -> Result<u32, ParseError> {
        match o {
            Opnd::Name(n) => match self.var(n) {
                Some(VarLoc::Param(off)) => Ok(off),
                _ => self.err(format!("'{n}' is not a .param variable")),
            },
            _ => self.err("call arguments must be .param variables"),
        }
    }
}

/// The half-precision operation an opcode's base names.
fn half_op(base: &str) -> Option<HalfOp> {
    Some(match base {
        "add" => HalfOp::Add,
        "sub" => HalfOp::Sub,
        "mul" => HalfOp::Mul,
        "fma" => HalfOp::Fma,
        "min" => HalfOp::Min,
        "max" => HalfOp::Max,
        "neg" => HalfOp::Neg,
        "abs" => HalfOp::Abs,
        _ => return None,
    })
}

fn wide(t: Ty) -> Ty {
    match t {
        Ty::S16 => Ty::S32,
        Ty::U16 => Ty::U32,
        Ty::S32 => Ty::S64,
        _ => Ty::U64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD: &str = ".version 8.5\n.target sm_90\n.address_size 64\n";

    fn parse(body: &str) -> Result<Module, ParseError> {
        Module::parse(&format!("{HEAD}{body}"))
    }

    #[test]
    fn params_layout() {
        let m = parse(
            ".visible .entry k(.param .u8 a, .param .u64 .ptr .global .align 16 b, .param .align 16 .b8 s[24], .param .u32 c)\n{ ret; }\n",
        )
        .unwrap();
        let k = m.kernel("k").unwrap();
        let offs: Vec<_> = k
            .params
            .iter()
            .map(|p| (p.offset, p.size, p.align))
            .collect();
        assert_eq!(offs, vec![(0, 1, 1), (8, 8, 8), (16, 24, 16), (40, 4, 4)]);
        assert_eq!(k.param_bytes, 44);
        assert!(m.kernel("nope").is_none());
        assert_eq!(m.version(), "8.5");
        assert_eq!(m.target(), "sm_90");
    }

    #[test]
    fn declarations_and_counts() {
        let m = parse(
            "/* multi\nline */ .shared .align 8 .b8 sm[100];\n.const .align 4 .u32 tab[3] = {1, 2, 3};\n.global .f32 g = 0f3F800000;\n\
             .extern .shared .align 16 .b8 dyn[];\n\
             .visible .entry k() .maxntid 128, 1, 1\n{\n.reg .b32 %r<4>;\n.reg .b64 %rd<2>;\n.reg .pred %p;\n.local .align 8 .b8 depot[16];\n\
             .loc 1 2 3\n.pragma \"nounroll\";\nmov.u32 %r1, tab;\nmov.u32 %r2, sm;\n@!%p bra L;\nL:\nret;\n}\n",
        )
        .unwrap();
        let k = m.kernel("k").unwrap();
        assert_eq!(k.shared_static, 100);
        // Per kernel: what it and its callees name.
        let m2 = parse(
            ".shared .align 4 .b8 a[64];\n.shared .align 4 .b8 b[32];\n.func f()\n{\n.reg .b32 %r;\nmov.u32 %r, b;\nret;\n}\n\
             .visible .entry k1()\n{\n.reg .b32 %r;\nmov.u32 %r, a;\nret;\n}\n\
             .visible .entry k2()\n{\ncall.uni f, ();\nret;\n}\n.visible .entry k3()\n{\nret;\n}\n",
        )
        .unwrap();
        assert_eq!(m2.kernel("k1").unwrap().shared_static, 64);
        // k2 names only b, which the module's layout places after a: it
        // takes b's 32 bytes, as a GPU counts it, in a block laid out to 96.
        assert_eq!(m2.kernel("k2").unwrap().shared_static, 32);
        assert_eq!(m2.kernel("k2").unwrap().shared_layout, 96);
        assert_eq!(m2.kernel("k3").unwrap().shared_static, 0);
        assert_eq!(m2.kernels().len(), 3);
        assert_eq!(k.local_per_thread, 16);
        assert_eq!(k.registers, 4 + 4 + 1);
        assert_eq!(k.max_threads, Some(128));
        assert_eq!(&m.statics[..12], &[1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0]);
        assert_eq!(&m.statics[12..16], &1.0f32.to_le_bytes());
    }

    #[test]
    fn errors_name_the_line() {
        let e = parse(".visible .entry k()\n{\n.reg .b32 %r<2>;\nadd.s32 %r1, %r1;\nret;\n}\n")
            .unwrap_err();
        assert_eq!(e.line, 7);
        assert!(e.msg.contains("3 operands"), "{e}");
        let e = parse(".visible .entry k()\n{\nadd.s32 %r1, %r1, 1;\n}\n").unwrap_err();
        assert_eq!(e.line, 6);
        assert!(e.msg.contains("undefined register '%r1'"), "{e}");
        let e = parse(".visible .entry k()\n{\nbra NOWHERE;\n}\n").unwrap_err();
        assert!(e.msg.contains("undefined label"), "{e}");
        assert_eq!(e.line, 6);
        // An instruction of the ISA the executor does not run: the module
        // loads, the kernel is refused with the line and the instruction.
        let m =
            parse(".visible .entry k()\n{\n.reg .b32 %r;\nsured.b.add.1d.u32 [%r, {%r}], %r;\n}\n")
                .unwrap();
        let e = m.refused("k").unwrap();
        assert!(
            e.msg
                .contains("unsupported instruction 'sured.b.add.1d.u32'"),
            "{e}"
        );
        assert_eq!(e.line, 7);
        // A name that is no instruction: malformed, the module refused.
        let e = parse(".visible .entry k()\n{\n.reg .b32 %r;\nfrobnicate.u32 %r, %r;\n}\n")
            .unwrap_err();
        assert!(
            e.msg.contains("unknown instruction 'frobnicate.u32'"),
            "{e}"
        );
        assert_eq!(e.line, 7);
        let e = parse(".visible .entry k()\n{\nret\n").unwrap_err();
        assert!(e.line >= 5, "{e}");
        let e =
            parse(".visible .entry k()\n{\n.reg .b32 %r;\nmov.u32 %r, 12abc;\n}\n").unwrap_err();
        assert!(e.msg.contains("bad number"), "{e}");
        let e = parse(".visible .entry k()\n{\ncall.uni f, ();\nret;\n}\n").unwrap_err();
        assert!(e.msg.contains("undefined function"), "{e}");
        assert!(Module::parse("/* open").is_err());
        assert!(Module::parse("\u{1F600}").is_err());
    }

    #[test]
    fn unsupported_instructions_refuse_only_the_kernels_that_reach_them() {
        let m = parse(
            ".visible .entry good(.param .u64 p)\n{\n.reg .b64 %rd;\nld.param.u64 %rd, [p];\nret;\n}\n\
             .func tex_fn()\n{\n.reg .f32 %f<6>;\n.reg .b64 %rd;\n\
             tld4.r.2d.v4.f32.f32 {%f1, %f2, %f3, %f4}, [%rd, {%f5, %f5}];\nret;\n}\n\
             .visible .entry via_call()\n{\ncall.uni tex_fn, ();\nret;\n}\n\
             .visible .entry direct()\n{\n.reg .b32 %r<3>;\nprmt.b32.f4e %r1, %r2, %r2, %r2;\nbrx.idx %r1, $t;\nret;\n}\n",
        )
        .unwrap();
        assert_eq!(m.kernels().len(), 3);
        assert!(m.refused("good").is_none());
        let e = m.refused("via_call").unwrap();
        assert_eq!(e.line, 14, "{e}");
        assert!(e.msg.contains("'tld4.r.2d.v4.f32.f32'"), "{e}");
        assert!(e.unsupported);
        // The first of a kernel's refused instructions names it.
        let e = m.refused("direct").unwrap();
        assert_eq!(e.line, 25, "{e}");
        assert!(e.msg.starts_with("'prmt.b32.f4e'"), "{e}");
        assert_eq!(m.refusals().len(), 3);
        // Malformed PTX still fails the whole module, as the driver's
        // compiler refuses it.
        let e = parse(".visible .entry k()\n{\n.reg .b32 %r;\nadd.s32 %r, %r;\n}\n.visible .entry ok()\n{\nret;\n}\n")
            .unwrap_err();
        assert!(!e.unsupported);
    }

    #[test]
    fn register_declarations_written_together() {
        // Inline assembly of cuda_fp16.h writes `.reg.b16` in nested scopes.
        let m = parse(
            ".visible .entry k()\n{\n.reg .b32 %r<2>;\n{.reg.b16 hl, hu;\n.reg.v2.b32 v;\nmov.b32 {hl, hu}, %r1;\n}\n{.reg.b32 c;\nmov.b32 c, %r1;\n}\nret;\n}\n",
        );
        let e = m.unwrap_err();
        assert!(e.msg.contains("vector registers"), "{e}");
        let m = parse(
            ".visible .entry k()\n{\n.reg .b32 %r<2>;\n{.reg.b16 hl, hu;\nmov.b32 {hl, hu}, %r1;\n}\n{.reg.b32 c;\nmov.b32 c, %r1;\n}\nret;\n}\n",
        )
        .unwrap();
        assert_eq!(m.kernel("k").unwrap().registers, 2 + 2 + 1);
        assert!(parse(".visible .entry k()\n{\n.reg.q16 x;\nret;\n}\n").is_err());
    }

    #[test]
    fn deep_nesting_is_refused() {
        let deep = "{".repeat(100_000);
        let e = parse(&format!(".global .u32 g[1] = {deep}1;\n")).unwrap_err();
        assert!(e.msg.contains("nested too deeply"), "{e}");
        let minus = "- ".repeat(100_000);
        let e = parse(&format!(
            ".visible .entry k()\n{{\n.reg .b32 %r;\nmov.u32 %r, {minus}1;\n}}\n"
        ))
        .unwrap_err();
        assert!(e.msg.contains("nested too deeply"), "{e}");
        let e = parse(".visible .entry k()\n{\n.reg .b32 %r<999999999>;\n}\n").unwrap_err();
        assert!(e.msg.contains("too many registers"), "{e}");
    }

    #[test]
    fn garbage_never_panics() {
        let base = format!("{HEAD}.visible .entry k(.param .u64 p)\n{{\n.reg .b32 %r<3>;\n.reg .pred %p;\nld.param.u32 %r1, [p+4];\nsetp.lt.and.s32 %p|%p, %r1, -5, !%p;\nmov.b64 %rd, {{%r1,%r2}};\n@%p bra $L;\n$L:\nret;\n}}\n");
        for cut in 0..base.len() {
            let _ = Module::parse(&base[..cut]);
        }
        for i in 0..base.len() {
            let mut b = base.clone().into_bytes();
            b[i] = b"{}[]();,.@!-|<>0x%"[i % 18];
            if let Ok(s) = String::from_utf8(b) {
                let _ = Module::parse(&s);
            }
        }
    }
}
