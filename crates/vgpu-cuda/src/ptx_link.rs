//! Linking several PTX inputs into one PTX module, as `cuLinkComplete`
//! does with relocatable device code (`nvcc -rdc -ptx`): the device
//! loads one image, and its backend compiles PTX, so the guest joins
//! the texts. An `.extern` symbol one input defines becomes a
//! declaration of that definition (functions) or is dropped in favour
//! of the definition, moved ahead of every input (variables); an
//! internal symbol two inputs both name is renamed in the later one;
//! a `.weak` symbol defined twice keeps its first (or `.visible`)
//! definition; header directives merge (the newest `.version`, the
//! highest `.target`), and debug line information is left out.

use std::collections::{HashMap, HashSet};
use std::fmt::Write;

use thiserror::Error;

/// Why inputs could not be linked.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum PtxLinkError {
    /// Two inputs define the same `.visible` symbol.
    #[error("multiple definitions of '{0}'")]
    Duplicate(String),
    /// The inputs disagree on their address size.
    #[error("inputs of {0}- and {1}-bit addresses")]
    AddressSize(u32, u32),
    /// A statement never ends (an unbalanced brace or a missing `;`).
    #[error("input {0}: a statement at byte {1} does not end")]
    Unterminated(usize, usize),
    /// An input without `.version` or `.target`.
    #[error("input {0} has no {1} directive")]
    NoHeader(usize, &'static str),
}

/// How a module-scope symbol is linked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Linkage {
    Internal,
    Visible,
    Weak,
    Extern,
}

/// What a module-scope statement is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    /// `.version`, `.target`, `.address_size`.
    Header,
    /// `.file`, `.section` (debug information).
    Debug,
    /// A function or kernel: with its body or only declared.
    Func { body: bool },
    /// A variable (`.global`, `.const`, `.shared`, ...).
    Var,
    /// Anything else (`.pragma`), kept as it is.
    Other,
}

/// One module-scope statement of an input.
#[derive(Debug, Clone)]
struct Stmt {
    /// Its text, from its first word to its end (`;` or `}`).
    text: String,
    /// What came before it (space and comments), kept as it is.
    gap: String,
    kind: Kind,
    linkage: Linkage,
    /// The symbol it declares or defines.
    name: Option<String>,
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'$' || b == b'%'
}

/// Skips a comment or string starting at `i` of `s`; where it ends, or
/// `i` where nothing of the kind starts there.
fn skip_opaque(s: &[u8], i: usize) -> usize {
    match (s[i], s.get(i + 1)) {
        (b'/', Some(b'/')) => s[i..]
            .iter()
            .position(|&b| b == b'\n')
            .map_or(s.len(), |p| i + p),
        (b'/', Some(b'*')) => s[i + 2..]
            .windows(2)
            .position(|w| w == b"*/")
            .map_or(s.len(), |p| i + 2 + p + 2),
        (b'"', _) => {
            let mut j = i + 1;
            while j < s.len() && s[j] != b'"' {
                j += if s[j] == b'\\' { 2 } else { 1 };
            }
            (j + 1).min(s.len())
        }
        _ => i,
    }
}

/// The words of a statement's head (up to its first `{`, `=` or `;`,
/// outside parentheses): directives and names, in order.
fn head_words(text: &str) -> Vec<&str> {
    let b = text.as_bytes();
    let (mut words, mut i, mut depth) = (Vec::new(), 0, 0);
    while i < b.len() {
        let j = skip_opaque(b, i);
        if j != i {
            i = j;
            continue;
        }
        match b[i] {
            b'(' => depth += 1,
            b')' => depth -= 1,
            b'{' | b'=' | b';' if depth == 0 => break,
            c if depth == 0 && (c == b'.' || is_ident(c)) => {
                let start = i;
                i += 1;
                while i < b.len() && is_ident(b[i]) {
                    i += 1;
                }
                words.push(&text[start..i]);
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    words
}

/// Classifies a statement by its head.
fn classify(text: &str) -> (Kind, Linkage, Option<String>) {
    let words = head_words(text);
    let mut linkage = Linkage::Internal;
    let mut kind = Kind::Other;
    let mut name = None;
    for (i, w) in words.iter().enumerate() {
        match *w {
            ".version" | ".target" | ".address_size" if i == 0 => {
                return (Kind::Header, linkage, None)
            }
            ".file" | ".section" | ".loc" if i == 0 => return (Kind::Debug, linkage, None),
            ".visible" => linkage = Linkage::Visible,
            ".weak" | ".common" => linkage = Linkage::Weak,
            ".extern" => linkage = Linkage::Extern,
            ".entry" | ".func" => {
                kind = Kind::Func {
                    body: text.trim_end().ends_with('}'),
                }
            }
            ".global" | ".const" | ".shared" | ".local" | ".tex" | ".surfref" | ".texref"
            | ".samplerref"
                if kind == Kind::Other =>
            {
                kind = Kind::Var
            }
            w if !w.starts_with('.')
                && !w.as_bytes()[0].is_ascii_digit()
                && kind != Kind::Other
                && name.is_none() =>
            {
                name = Some(w.to_string());
            }
            _ => {}
        }
    }
    (kind, linkage, name)
}

/// Splits a PTX text into its module-scope statements; the text after
/// the last one (space, comments) is returned beside them.
fn statements(text: &str, input: usize) -> Result<(Vec<Stmt>, String), PtxLinkError> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    loop {
        // The gap: space and comments.
        let gap_start = i;
        loop {
            while i < b.len() && b[i].is_ascii_whitespace() {
                i += 1;
            }
            if i < b.len() && b[i] == b'/' {
                let j = skip_opaque(b, i);
                if j != i {
                    i = j;
                    continue;
                }
            }
            break;
        }
        if i >= b.len() {
            return Ok((out, text[gap_start..].to_string()));
        }
        let start = i;
        // Header and line directives end with their line.
        let line_directive = [".version", ".target", ".address_size", ".file", ".loc"]
            .iter()
            .any(|d| text[start..].starts_with(d));
        let mut depth = 0i32;
        let end = loop {
            if line_directive && (i >= b.len() || b[i] == b'\n') {
                break i;
            }
            if i >= b.len() {
                return Err(PtxLinkError::Unterminated(input, start));
            }
            let j = skip_opaque(b, i);
            if j != i {
                i = j;
                continue;
            }
            match b[i] {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth < 0 {
                        return Err(PtxLinkError::Unterminated(input, start));
                    }
                    // A body ends the statement; an initializer's
                    // braces are followed by its `;`.
                    if depth == 0 {
                        let head = head_words(&text[start..i]);
                        if head
                            .iter()
                            .any(|w| matches!(*w, ".entry" | ".func" | ".section"))
                        {
                            break i + 1;
                        }
                    }
                }
                b';' if depth == 0 => break i + 1,
                _ => {}
            }
            i += 1;
        };
        i = end;
        let stmt = &text[start..end];
        let (kind, linkage, name) = classify(stmt);
        out.push(Stmt {
            text: stmt.to_string(),
            gap: text[gap_start..start].to_string(),
            kind,
            linkage,
            name,
        });
    }
}

/// `text` with every identifier in `names` (outside comments and
/// strings, and not a directive's or type's suffix) given `suffix`.
fn rename(text: &str, names: &HashSet<String>, suffix: &str) -> String {
    if names.is_empty() {
        return text.to_string();
    }
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        let j = skip_opaque(b, i);
        if j != i {
            out.push_str(&text[i..j]);
            i = j;
            continue;
        }
        if is_ident(b[i]) && (i == 0 || (b[i - 1] != b'.' && !is_ident(b[i - 1]))) {
            let start = i;
            while i < b.len() && is_ident(b[i]) {
                i += 1;
            }
            let word = &text[start..i];
            out.push_str(word);
            if names.contains(word) {
                out.push_str(suffix);
            }
            continue;
        }
        let c = text[i..].chars().next().expect("in bounds");
        out.push(c);
        i += c.len_utf8();
    }
    out
}

/// The header of the linked module.
#[derive(Default)]
struct Header {
    version: (u32, u32),
    target: Option<(u32, String)>,
    address_size: Option<u32>,
}

impl Header {
    /// Takes in one input's header directive.
    fn add(&mut self, text: &str) -> Result<(), PtxLinkError> {
        let words: Vec<&str> = text
            .trim_end_matches(';')
            .split(|c: char| c.is_whitespace() || c == ',')
            .filter(|w| !w.is_empty())
            .collect();
        match words.as_slice() {
            [".version", v, ..] => {
                let (major, minor) = v.split_once('.').unwrap_or((v, "0"));
                let v = (major.parse().unwrap_or(0), minor.parse().unwrap_or(0));
                self.version = self.version.max(v);
            }
            [".target", arch, ..] => {
                let digits: String = arch
                    .trim_start_matches("sm_")
                    .chars()
                    .take_while(char::is_ascii_digit)
                    .collect();
                let n = digits.parse().unwrap_or(0);
                if self.target.as_ref().is_none_or(|(m, _)| n > *m) {
                    self.target = Some((n, arch.to_string()));
                }
            }
            [".address_size", n, ..] => {
                let n = n.parse().unwrap_or(0);
                match self.address_size {
                    Some(m) if m != n => return Err(PtxLinkError::AddressSize(m, n)),
                    _ => self.address_size = Some(n),
                }
            }
            _ => {}
        }
        Ok(())
    }
}

/// Links PTX texts into one module (see the module's documentation).
pub fn link(inputs: &[&str]) -> Result<String, PtxLinkError> {
    let mut parsed = Vec::with_capacity(inputs.len());
    for (n, text) in inputs.iter().enumerate() {
        parsed.push(statements(text, n)?);
    }
    let mut header = Header::default();
    for (n, (stmts, _)) in parsed.iter().enumerate() {
        let mut has = (false, false);
        for s in stmts.iter().filter(|s| s.kind == Kind::Header) {
            has.0 |= s.text.starts_with(".version");
            has.1 |= s.text.starts_with(".target");
            header.add(&s.text)?;
        }
        if !has.0 {
            return Err(PtxLinkError::NoHeader(n, ".version"));
        }
        if !has.1 {
            return Err(PtxLinkError::NoHeader(n, ".target"));
        }
    }

    // Internal symbols another input names too are renamed.
    let mut naming: HashMap<String, HashSet<usize>> = HashMap::new();
    for (n, (stmts, _)) in parsed.iter().enumerate() {
        for name in stmts.iter().filter_map(|s| s.name.clone()) {
            naming.entry(name).or_default().insert(n);
        }
    }
    for (n, (stmts, _)) in parsed.iter_mut().enumerate() {
        let clashes: HashSet<String> = stmts
            .iter()
            .filter(|s| s.linkage == Linkage::Internal)
            .filter_map(|s| s.name.clone())
            .filter(|name| naming.get(name).is_some_and(|ins| ins.len() > 1))
            .collect();
        if clashes.is_empty() {
            continue;
        }
        let suffix = format!("$vgpu_link{n}");
        for s in stmts.iter_mut() {
            s.text = rename(&s.text, &clashes, &suffix);
            if let Some(name) = &s.name {
                if clashes.contains(name) {
                    s.name = Some(format!("{name}{suffix}"));
                }
            }
        }
    }

    // The definition each external symbol resolves to: the `.visible`
    // one, else the first `.weak` one.
    let mut defs: HashMap<String, (usize, usize, Linkage)> = HashMap::new();
    for (n, (stmts, _)) in parsed.iter().enumerate() {
        for (k, s) in stmts.iter().enumerate() {
            let defines = match s.kind {
                Kind::Func { body } => body,
                Kind::Var => true,
                _ => false,
            };
            let Some(name) = &s.name else { continue };
            if !defines || !matches!(s.linkage, Linkage::Visible | Linkage::Weak) {
                continue;
            }
            match defs.get(name) {
                Some(&(_, _, Linkage::Visible)) if s.linkage == Linkage::Visible => {
                    return Err(PtxLinkError::Duplicate(name.clone()))
                }
                Some(&(_, _, Linkage::Visible)) => {}
                Some(_) if s.linkage == Linkage::Weak => {}
                _ => {
                    defs.insert(name.clone(), (n, k, s.linkage));
                }
            }
        }
    }

    // Variables that an input declares or defines elsewhere than their
    // definition go first, so every input's uses follow them.
    let mut hoisted: HashSet<(usize, usize)> = HashSet::new();
    for (n, (stmts, _)) in parsed.iter().enumerate() {
        for s in stmts.iter().filter(|s| s.kind == Kind::Var) {
            let Some(&(dn, dk, _)) = s.name.as_ref().and_then(|name| defs.get(name)) else {
                continue;
            };
            if dn != n {
                hoisted.insert((dn, dk));
            }
        }
    }

    let mut out = String::new();
    let _ = writeln!(out, ".version {}.{}", header.version.0, header.version.1);
    if let Some((_, arch)) = &header.target {
        let _ = writeln!(out, ".target {arch}");
    }
    if let Some(n) = header.address_size {
        let _ = writeln!(out, ".address_size {n}");
    }
    let mut hoisted_sorted: Vec<_> = hoisted.iter().copied().collect();
    hoisted_sorted.sort_unstable();
    for &(n, k) in &hoisted_sorted {
        let _ = writeln!(out, "\n{}", parsed[n].0[k].text);
    }
    let mut undefined_seen: HashSet<String> = HashSet::new();
    for (n, (stmts, tail)) in parsed.iter().enumerate() {
        for (k, s) in stmts.iter().enumerate() {
            if matches!(s.kind, Kind::Header | Kind::Debug) || hoisted.contains(&(n, k)) {
                continue;
            }
            let def = s.name.as_ref().and_then(|name| defs.get(name)).copied();
            let text = match (&s.kind, s.linkage, def) {
                // Internal symbols are this input's own.
                (_, Linkage::Internal, _) | (Kind::Other | Kind::Header | Kind::Debug, _, _) => {
                    strip_lines(&s.text)
                }
                // The definition itself.
                (_, _, Some((dn, dk, _))) if (dn, dk) == (n, k) => strip_lines(&s.text),
                // Another input defines it: a function is declared with
                // the definition's linkage, a variable is the hoisted
                // definition.
                (Kind::Func { body }, _, Some((_, _, linkage))) => {
                    let head = if *body {
                        s.text[..s.text.find('{').unwrap_or(s.text.len())].trim_end()
                    } else {
                        s.text.trim_end().trim_end_matches(';')
                    };
                    let word = if linkage == Linkage::Weak {
                        ".weak"
                    } else {
                        ".visible"
                    };
                    format!("{word} {};", strip_linkage(head))
                }
                (_, _, Some(_)) => continue,
                // Defined nowhere: declared once, by its first input.
                (_, _, None) => {
                    let name = s.name.clone().unwrap_or_default();
                    if !undefined_seen.insert(name) {
                        continue;
                    }
                    strip_lines(&s.text)
                }
            };
            out.push_str(&s.gap);
            out.push_str(&text);
        }
        out.push_str(tail);
        out.push('\n');
    }
    Ok(out)
}

/// A statement's head without its linkage directive.
fn strip_linkage(head: &str) -> &str {
    let h = head.trim_start();
    for w in [".visible", ".weak", ".extern", ".common"] {
        if let Some(rest) = h.strip_prefix(w) {
            return rest.trim_start();
        }
    }
    h
}

/// A statement without its `.loc` lines (their `.file` numbers belong to
/// its input, whose `.file` directives are left out).
fn strip_lines(text: &str) -> String {
    if !text.contains(".loc") {
        return text.to_string();
    }
    text.lines()
        .filter(|l| !l.trim_start().starts_with(".loc"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    const USER: &str = "//\n// user\n.version 8.0\n.target sm_80\n.address_size 64\n\
        .extern .func (.param .b32 func_retval0) twice(.param .b32 x);\n\
        .extern .global .align 4 .u32 bias;\n\
        .global .align 4 .b8 $str[3] = {104, 105, 0};\n\
        .visible .entry use(.param .u64 p)\n{\n .reg .b32 %r<4>;\n .reg .b64 %rd<3>;\n\
        .loc 1 5 0\n ld.param.u64 %rd1, [p];\n mov.u32 %r1, %tid.x;\n\
        { .param .b32 a; .param .b32 r; st.param.b32 [a], %r1;\n\
        call.uni (r), twice, (a); ld.param.b32 %r2, [r]; }\n\
        ld.global.u32 %r3, [bias];\n add.s32 %r2, %r2, %r3;\n\
        mul.wide.u32 %rd2, %r1, 4;\n add.s64 %rd1, %rd1, %rd2;\n\
        st.global.u32 [%rd1], %r2;\n ret;\n}\n.file 1 \"user.cu\"\n";

    const DEFS: &str = ".version 8.4\n.target sm_90\n.address_size 64\n\
        .global .align 1 .b8 $str[2] = {65, 0};\n\
        .visible .global .align 4 .u32 bias = 7;\n\
        .visible .func (.param .b32 func_retval0) twice(.param .b32 x)\n{\n .reg .b32 %r<2>;\n\
        ld.param.b32 %r1, [x];\n add.s32 %r1, %r1, %r1;\n st.param.b32 [func_retval0], %r1;\n ret;\n}\n";

    #[test]
    fn statements_end_at_semicolons_and_bodies() {
        let (stmts, _) = statements(USER, 0).unwrap();
        let kinds: Vec<_> = stmts.iter().map(|s| (s.kind.clone(), s.linkage)).collect();
        assert_eq!(
            kinds,
            vec![
                (Kind::Header, Linkage::Internal),
                (Kind::Header, Linkage::Internal),
                (Kind::Header, Linkage::Internal),
                (Kind::Func { body: false }, Linkage::Extern),
                (Kind::Var, Linkage::Extern),
                (Kind::Var, Linkage::Internal),
                (Kind::Func { body: true }, Linkage::Visible),
                (Kind::Debug, Linkage::Internal),
            ]
        );
        let names: Vec<_> = stmts.iter().filter_map(|s| s.name.as_deref()).collect();
        assert_eq!(names, ["twice", "bias", "$str", "use"]);
        assert!(statements("{ .reg .b32 %r;", 0).is_err());
    }

    #[test]
    fn two_inputs_link_into_one_module_the_executor_loads() {
        let linked = link(&[USER, DEFS]).unwrap();
        // The newest version and highest target; one header.
        assert!(linked.starts_with(".version 8.4\n.target sm_90\n.address_size 64\n"));
        assert_eq!(linked.matches(".version").count(), 1);
        // The extern function became a declaration, the extern variable
        // gave way to its definition, which comes first.
        assert!(!linked.contains(".extern"));
        let bias = linked.find(".visible .global .align 4 .u32 bias").unwrap();
        assert!(bias < linked.find(".entry use").unwrap());
        assert_eq!(linked.matches(".u32 bias").count(), 1);
        // Each input's internal $str was renamed.
        assert!(linked.contains("$str$vgpu_link0[3]"));
        assert!(linked.contains("$str$vgpu_link1[2]"));
        assert!(!linked.contains(".loc") && !linked.contains(".file"));
        let m = vgpu_ptx::Module::parse(&linked).unwrap();
        let mut names: Vec<_> = m.kernels().into_iter().map(|k| k.name).collect();
        names.sort();
        assert_eq!(names, ["use"]);
    }

    #[test]
    fn weak_definitions_keep_one_and_visible_ones_clash() {
        let weak = ".version 8.0\n.target sm_80\n.address_size 64\n\
            .weak .func (.param .b32 r) helper(.param .b32 x)\n{\n ret;\n}\n";
        let linked = link(&[weak, weak]).unwrap();
        assert_eq!(linked.matches("helper(.param .b32 x)\n{").count(), 1);
        assert!(linked.contains(".weak .func (.param .b32 r) helper(.param .b32 x);"));
        vgpu_ptx::Module::parse(&linked).unwrap();
        assert_eq!(
            link(&[DEFS, DEFS]),
            Err(PtxLinkError::Duplicate("bias".into()))
        );
    }

    #[test]
    fn undefined_externs_are_declared_once() {
        let printing = ".version 8.0\n.target sm_80\n.address_size 64\n\
            .extern .func (.param .b32 r) vprintf(.param .b64 f, .param .b64 a);\n";
        let linked = link(&[printing, printing]).unwrap();
        assert_eq!(linked.matches(".extern .func").count(), 1);
    }

    #[test]
    fn headers_must_agree_and_be_there() {
        let narrow = ".version 8.0\n.target sm_80\n.address_size 32\n";
        assert_eq!(
            link(&[DEFS, narrow]),
            Err(PtxLinkError::AddressSize(64, 32))
        );
        assert_eq!(
            link(&[DEFS, ".target sm_80\n"]),
            Err(PtxLinkError::NoHeader(1, ".version"))
        );
    }

    #[test]
    fn renaming_leaves_directives_comments_and_strings_alone() {
        let names: HashSet<String> = ["x".to_string()].into();
        assert_eq!(
            rename("ld.global.x [x]; // x\n.pragma \"x\"; x1 x", &names, "$1"),
            "ld.global.x [x$1]; // x\n.pragma \"x\"; x1 x$1"
        );
    }
}
