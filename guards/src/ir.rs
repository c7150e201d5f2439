//! What rustc compiled, read back: the LLVM IR (`--emit=llvm-ir`, v0 symbol mangling) of the
//! guarded crate, one file per codegen unit.
//!
//! The reader keeps what the walk needs and nothing else: every function defined (its symbol,
//! its direct calls with the source line of each, its indirect calls: through which vtable slot
//! or a plain function pointer, and with which LLVM signature, and every global it takes the
//! address of), every vtable and constant or static with the symbols stored in it, and the
//! debug locations that turn a call into `file:line`.
//!
//! LLVM IR is the compiled program after macro expansion, `cfg`, `include!`, name resolution,
//! type inference and monomorphisation: a call names the exact instance it runs (generic
//! arguments included), drop glue is explicit, closures and async bodies are their own
//! functions, and a value stored for later (a function pointer, a boxed closure, a trait
//! object) shows as the address of the function or vtable it stores.

use std::collections::HashMap;

/// A symbol the IR names: a function, a vtable, a static or a constant.
pub type Symbol = String;

/// A debug-info node: its unit and its number there (`!123`).
pub type Dbg = (u32, u32);

/// One codegen unit's or many units' worth of IR, merged.
#[derive(Debug, Default)]
pub struct Module {
    /// Every function with a body, by symbol.
    pub functions: HashMap<Symbol, Function>,
    /// Every global with an initialiser (vtables, constants, statics), by symbol.
    pub globals: HashMap<Symbol, Global>,
    /// Functions declared without a body here: other crates' code.
    pub declared: std::collections::HashSet<Symbol>,
    /// Source files by debug-info file node.
    files: HashMap<Dbg, String>,
    /// Debug scopes (subprograms, blocks) to their file node.
    scopes: HashMap<Dbg, Dbg>,
    /// Debug locations a use or definition refers to: line and scope.
    locations: HashMap<Dbg, (u32, Dbg)>,
    /// A subprogram's own line, for a function's definition.
    subprograms: HashMap<Dbg, u32>,
    units: u32,
}

/// A function defined in the crate (or an instance of another crate's generic code that this
/// crate instantiated).
#[derive(Debug, Default, Clone)]
pub struct Function {
    /// Its symbol as mangled (`_R...`, or a unit-local name like `unit3:vtable.0`).
    pub symbol: Symbol,
    /// Its LLVM signature, for matching indirect calls.
    pub signature: Signature,
    /// What it calls and takes the address of, in order.
    pub uses: Vec<Use>,
    /// Its debug subprogram, for its own location.
    pub dbg: Option<Dbg>,
    /// `internal`/`private` linkage: a copy local to its unit.
    pub local: bool,
}

/// Something a function does with another symbol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Use {
    /// What is called or referenced.
    pub kind: UseKind,
    /// The debug location of the instruction, when it has one.
    pub dbg: Option<Dbg>,
}

/// How a function uses another symbol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UseKind {
    /// A direct call (`call`/`invoke` of `@symbol`).
    Call(Symbol),
    /// A call through slot `slot` (0 = drop, 1 = size, 2 = align, 3.. = methods) of a vtable
    /// that is not known here: any vtable whose slot has a function of this signature.
    Virtual {
        /// The slot.
        slot: u32,
        /// The call's LLVM signature.
        signature: Signature,
        /// The function whose return value the trait object is, when it is one called right
        /// there (`log::logger().log(..)`): an object another crate hands out.
        source: Option<Symbol>,
    },
    /// A call through a function pointer that did not come from a vtable: any function whose
    /// address the crate takes, of this signature.
    Pointer {
        /// The call's LLVM signature.
        signature: Signature,
    },
    /// The address of a function, vtable, static or constant, taken as a value (stored,
    /// passed, returned): what it points to may run later, by whoever holds it.
    Address(Symbol),
}

/// An LLVM function type, as far as calls must agree on it: the return type and each
/// parameter's type (without attributes). `None` where the reader could not tell: matches all.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Signature(pub Option<(String, Vec<String>)>);

impl Signature {
    /// Could a call of signature `self` land in a function of signature `other`?
    pub fn admits(&self, other: &Signature) -> bool {
        match (&self.0, &other.0) {
            (Some(a), Some(b)) => a == b,
            _ => true,
        }
    }
}

/// A global with an initialiser.
#[derive(Debug, Clone, Default)]
pub struct Global {
    /// Its symbol.
    pub symbol: Symbol,
    /// `vtable.N`: a trait object's table.
    pub vtable: bool,
    /// A `static` (mutable or with interior mutability: `global`, not `constant`).
    pub writable: bool,
    /// The symbols stored in it, with their byte offsets.
    pub slots: Vec<(u64, Symbol)>,
}

impl Global {
    /// The symbol in vtable slot `slot`, if any (`ptr null` slots hold none).
    pub fn slot(&self, slot: u32) -> Option<&Symbol> {
        let offset = u64::from(slot) * 8;
        self.slots.iter().find(|(o, _)| *o == offset).map(|(_, s)| s)
    }
}

impl Module {
    /// Reads one unit's IR text into the module. Unit-local names (`private`/`internal`
    /// globals without a Rust symbol, debug nodes) are kept apart per unit.
    pub fn add_unit(&mut self, text: &str) {
        let unit = self.units;
        self.units += 1;
        self.read_unit(unit, text);
    }

    /// Reads IR files, one unit each, on every core; the units are numbered in `paths` order.
    pub fn read_files(paths: &[std::path::PathBuf]) -> std::io::Result<Module> {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(paths.len().max(1));
        let chunk = paths.len().div_ceil(threads.max(1)).max(1);
        let parts: Vec<std::io::Result<Module>> = std::thread::scope(|scope| {
            let handles: Vec<_> = paths
                .chunks(chunk)
                .enumerate()
                .map(|(c, files)| {
                    scope.spawn(move || {
                        let mut module = Module::default();
                        for (i, path) in files.iter().enumerate() {
                            let text = std::fs::read_to_string(path)?;
                            module.read_unit((c * chunk + i) as u32, &text);
                        }
                        Ok(module)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err(std::io::Error::other("reader panicked"))))
                .collect()
        });
        let mut module = Module { units: paths.len() as u32, ..Module::default() };
        for part in parts {
            module.merge(part?);
        }
        Ok(module)
    }

    fn merge(&mut self, other: Module) {
        for (k, v) in other.functions {
            self.functions.entry(k).or_insert(v);
        }
        for (k, v) in other.globals {
            self.globals.entry(k).or_insert(v);
        }
        self.declared.extend(other.declared);
        self.files.extend(other.files);
        self.scopes.extend(other.scopes);
        self.locations.extend(other.locations);
        self.subprograms.extend(other.subprograms);
    }

    fn read_unit(&mut self, unit: u32, text: &str) {
        // The debug locations the unit's code refers to: only those are kept (metadata comes
        // after the code in a unit's text).
        let mut needed: std::collections::HashSet<u32> = std::collections::HashSet::new();
        let mut lines = text.lines();
        while let Some(line) = lines.next() {
            if line.starts_with("define ") {
                let mut body = Vec::new();
                for inner in lines.by_ref() {
                    if inner == "}" {
                        break;
                    }
                    body.push(inner);
                }
                if let Some(function) = parse_function(unit, line, &body) {
                    needed.extend(function.uses.iter().filter_map(|u| u.dbg.map(|(_, id)| id)));
                    self.functions.entry(function.symbol.clone()).or_insert(function);
                }
            } else if line.starts_with("declare ") {
                if let Some(symbol) = symbol_after_at(line, line.find('@').unwrap_or(0)) {
                    self.declared.insert(qualify(unit, &symbol));
                }
            } else if line.starts_with('@') {
                if let Some(global) = parse_global(unit, line) {
                    self.globals.entry(global.symbol.clone()).or_insert(global);
                }
            } else if line.starts_with('!') {
                self.add_metadata(unit, line, &needed);
            }
        }
    }

    fn add_metadata(&mut self, unit: u32, line: &str, needed: &std::collections::HashSet<u32>) {
        let Some((id, node)) = line.split_once(" = ") else { return };
        let Some(id) = node_id(id) else { return };
        let node = node.trim_start_matches("distinct ");
        if node.starts_with("!DILocation(") {
            if !needed.contains(&id) {
                return;
            }
            let line_no = field(node, "line").and_then(|v| v.parse().ok()).unwrap_or(0);
            if let Some(scope) = field(node, "scope").and_then(node_id) {
                self.locations.insert((unit, id), (line_no, (unit, scope)));
            }
        } else if node.starts_with("!DIFile(") {
            let name = quoted_field(node, "filename").unwrap_or_default();
            self.files.insert((unit, id), name);
        } else if node.starts_with("!DISubprogram(")
            || node.starts_with("!DILexicalBlock(")
            || node.starts_with("!DILexicalBlockFile(")
        {
            if let Some(file) = field(node, "file").and_then(node_id) {
                self.scopes.insert((unit, id), (unit, file));
            }
            if node.starts_with("!DISubprogram(") {
                let line_no = field(node, "line").and_then(|v| v.parse().ok()).unwrap_or(0);
                self.subprograms.insert((unit, id), line_no);
            }
        }
    }

    /// `file:line` of a debug location, as rustc recorded the file (relative to the crate
    /// root for the crate's own files).
    pub fn location(&self, dbg: Dbg) -> Option<(String, u32)> {
        let (line, scope) = self.locations.get(&dbg)?;
        let file = self.files.get(self.scopes.get(scope)?)?;
        Some((file.clone(), *line))
    }

    /// `file:line` where a function is defined.
    pub fn definition(&self, function: &Function) -> Option<(String, u32)> {
        let dbg = function.dbg?;
        let file = self.files.get(self.scopes.get(&dbg)?)?;
        Some((file.clone(), *self.subprograms.get(&dbg)?))
    }
}

/// A unit-local name (no Rust symbol: `vtable.0`, `alloc_…`, `anon.…`, `str.0`) is prefixed with
/// its unit so that two units' `vtable.0` stay two vtables; Rust symbols (`_R…`) are global.
/// `!123` as 123.
fn node_id(text: &str) -> Option<u32> {
    text.trim().strip_prefix('!')?.parse().ok()
}

fn qualify(unit: u32, name: &str) -> Symbol {
    if name.starts_with("_R") { name.to_owned() } else { format!("unit{unit}:{name}") }
}

/// The value of `key: value` inside a metadata node, up to the next `,` or `)`.
fn field<'a>(node: &'a str, key: &str) -> Option<&'a str> {
    let pattern = format!("{key}: ");
    let mut from = 0;
    while let Some(at) = node[from..].find(&pattern) {
        let start = from + at;
        // A whole key: preceded by `(` or a space.
        if start == 0 || matches!(node.as_bytes()[start - 1], b'(' | b' ') {
            let rest = &node[start + pattern.len()..];
            let end = rest.find([',', ')']).unwrap_or(rest.len());
            return Some(&rest[..end]);
        }
        from = start + pattern.len();
    }
    None
}

fn quoted_field(node: &str, key: &str) -> Option<String> {
    let pattern = format!("{key}: \"");
    let start = node.find(&pattern)? + pattern.len();
    let rest = &node[start..];
    let end = rest.find('"')?;
    Some(rest[..end].to_owned())
}

/// The symbol right after the `@` at `at`: `@name` or `@"quoted name"`.
fn symbol_after_at(line: &str, at: usize) -> Option<Symbol> {
    let rest = line.get(at + 1..)?;
    if let Some(quoted) = rest.strip_prefix('"') {
        let end = quoted.find('"')?;
        return Some(quoted[..end].to_owned());
    }
    let end =
        rest.find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '$' | '-'))).unwrap_or(rest.len());
    (end > 0).then(|| rest[..end].to_owned())
}

/// Every `@symbol` in `text`, with its byte position.
fn symbols(text: &str) -> Vec<(usize, Symbol)> {
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(at) = text[i..].find('@') {
        let pos = i + at;
        // Not an e-mail-like `x@y` inside a string constant: `@` starts a token.
        let starts_token = pos == 0 || matches!(bytes[pos - 1], b' ' | b'(' | b',' | b'<' | b'{' | b'[');
        if starts_token && let Some(symbol) = symbol_after_at(text, pos) {
            i = pos + 1 + symbol.len();
            out.push((pos, symbol));
            continue;
        }
        i = pos + 1;
    }
    out
}

/// Splits `a, b, c` at top-level commas (not inside `()`, `{}`, `[]`, `<>` or quotes).
fn split_top(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut quoted = false;
    let mut start = 0;
    for (i, c) in text.char_indices() {
        match c {
            '"' => quoted = !quoted,
            '(' | '{' | '[' | '<' if !quoted => depth += 1,
            ')' | '}' | ']' | '>' if !quoted => depth -= 1,
            ',' if !quoted && depth == 0 => {
                out.push(text[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    let last = text[start..].trim();
    if !last.is_empty() {
        out.push(last);
    }
    out
}

/// The first type of a parameter or argument: `ptr noalias align 8 %x` is `ptr`,
/// `{ ptr, i64 } %y` is `{ ptr, i64 }`.
fn leading_type(text: &str) -> String {
    let text = text.trim();
    let open = text.chars().next();
    if let Some(open @ ('{' | '[' | '<')) = open {
        let close = match open {
            '{' => '}',
            '[' => ']',
            _ => '>',
        };
        return match balanced(text.char_indices(), &[open], &[close], false) {
            Some(end) => text[..=end].to_owned(),
            None => text.to_owned(),
        };
    }
    text.split_whitespace().next().unwrap_or_default().to_owned()
}

/// The byte at which the parenthesised group opening at `open` closes.
fn matching_paren(text: &str, open: usize) -> Option<usize> {
    balanced(text[open..].char_indices(), &['('], &[')'], true).map(|end| open + end)
}

/// Where a bracketed group closes. `chars` runs from the group's opening bracket: a text's
/// `char_indices()`, or their reverse from a closing bracket (with `open` and `close`
/// swapped). Each char of `open` nests one level deeper and each char of `close` ends one, so
/// the caller picks which brackets count; with `quotes`, text between double quotes is
/// skipped. The byte index of the char that brings the depth back to zero, or `None` when
/// none does.
pub(crate) fn balanced(
    chars: impl Iterator<Item = (usize, char)>,
    open: &[char],
    close: &[char],
    quotes: bool,
) -> Option<usize> {
    let mut depth = 0;
    let mut quoted = false;
    for (i, c) in chars {
        match c {
            '"' if quotes => quoted = !quoted,
            _ if quoted => {}
            _ if open.contains(&c) => depth += 1,
            _ if close.contains(&c) => {
                depth -= 1;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// `define [linkage ...] <ret> @sym(<params>) ... {`
fn parse_function(unit: u32, header: &str, body: &[&str]) -> Option<Function> {
    let at = header.find('@')?;
    let name = symbol_after_at(header, at)?;
    let symbol = qualify(unit, &name);
    let before = &header["define ".len()..at];
    let local = before.split_whitespace().any(|w| w == "internal" || w == "private");
    let open = header[at..].find('(')? + at;
    let close = matching_paren(header, open)?;
    let params = split_top(&header[open + 1..close]).into_iter().map(leading_type).collect();
    let ret = return_type(before);
    let signature = Signature(ret.map(|r| (r, params)));
    let dbg = header[close..].find("!dbg !").and_then(|i| {
        let rest = &header[close + i + "!dbg ".len()..];
        let end = rest.find([' ', ',', '{']).unwrap_or(rest.len());
        node_id(&rest[..end]).map(|id| (unit, id))
    });

    // SSA names of this body: `%x = getelementptr inbounds i8, ptr %vt, i64 24` and
    // `%f = load ptr, ptr %x, ... !invariant.load`, to tell a vtable slot from a plain pointer.
    let mut offsets: HashMap<&str, (&str, i64)> = HashMap::new();
    let mut vtable_loads: HashMap<&str, (u32, Option<Symbol>)> = HashMap::new();
    // `%v = call { ptr, ptr } @f(..)` then `%v.1 = extractvalue { ptr, ptr } %v, 1`: the
    // vtable half of a trait object `f` returned.
    let mut returned_by: HashMap<&str, Symbol> = HashMap::new();
    let mut vtable_of: HashMap<&str, Symbol> = HashMap::new();
    let mut uses = Vec::new();
    for (index, line) in body.iter().enumerate() {
        let line = line.trim_start();
        if line.starts_with(';') || line.is_empty() {
            continue;
        }
        let (def, rest) = match line.split_once(" = ") {
            Some((d, r)) if d.starts_with('%') => (Some(d), r),
            _ => (None, line),
        };
        if let (Some(def), Some(gep)) = (def, rest.strip_prefix("getelementptr inbounds i8, ptr ")) {
            let parts: Vec<&str> = gep.split(", ").collect();
            if parts.len() >= 2
                && let Some(offset) = parts[1].strip_prefix("i64 ").and_then(|o| o.trim().parse::<i64>().ok())
            {
                offsets.insert(def, (parts[0].trim(), offset));
            }
        }
        if let (Some(def), Some(extract)) = (def, rest.strip_prefix("extractvalue { ptr, ptr } "))
            && let Some((value, index)) = extract.split_once(", ")
            && index.split(',').next() == Some("1")
            && let Some(f) = returned_by.get(value.trim())
        {
            vtable_of.insert(def, f.clone());
        }
        if let (Some(def), Some(load)) = (def, rest.strip_prefix("load ptr, ptr "))
            && line.contains("!invariant.load")
        {
            let from = load.split(',').next().unwrap_or_default().trim();
            let (base, offset) = offsets.get(from).copied().unwrap_or((from, 0));
            if offset >= 0 && offset % 8 == 0 {
                vtable_loads.insert(def, ((offset / 8) as u32, vtable_of.get(base).cloned()));
            }
        }
        // An `invoke` continues on the next line (`to label %a unwind label %b, !dbg !N`),
        // which carries its location.
        let next = body.get(index + 1).map(|l| l.trim_start()).filter(|l| l.starts_with("to label "));
        let dbg = [Some(line), next].into_iter().flatten().find_map(|line| {
            let i = line.rfind("!dbg !")?;
            let rest = &line[i + "!dbg ".len()..];
            let end = rest.find([' ', ',']).unwrap_or(rest.len());
            node_id(&rest[..end]).map(|id| (unit, id))
        });
        let call = call_site(rest);
        let mut callee_at = None;
        if let Some((callee, ret, args_at)) = call {
            let close = matching_paren(rest, args_at);
            let args: Vec<String> = close
                .map(|c| split_top(&rest[args_at + 1..c]).into_iter().map(leading_type).collect())
                .unwrap_or_default();
            let signature = Signature(close.map(|_| (ret.to_owned(), args)));
            if let Some(name) = callee.strip_prefix('@') {
                let name = name.trim_matches('"');
                callee_at = Some(rest.find(callee).unwrap_or(0));
                if let Some(def) = def {
                    returned_by.insert(def, qualify(unit, name));
                }
                if !name.starts_with("llvm.") {
                    uses.push(Use { kind: UseKind::Call(qualify(unit, name)), dbg });
                }
            } else if let Some((slot, source)) = vtable_loads.get(callee) {
                let kind = UseKind::Virtual { slot: *slot, signature, source: source.clone() };
                uses.push(Use { kind, dbg });
            } else if callee.starts_with('%') {
                uses.push(Use { kind: UseKind::Pointer { signature }, dbg });
            } else {
                // Inline asm or a cast expression as callee: any function of any signature.
                uses.push(Use { kind: UseKind::Pointer { signature: Signature(None) }, dbg });
            }
        }
        for (pos, name) in symbols(rest) {
            if Some(pos) == callee_at || name.starts_with("llvm.") || name == "rust_eh_personality" {
                continue;
            }
            uses.push(Use { kind: UseKind::Address(qualify(unit, &name)), dbg });
        }
    }
    Some(Function { symbol, signature, uses, dbg, local })
}

/// The return type in the words before the symbol of a `define`/`declare`: the last type-like
/// token after linkage, visibility and attributes.
fn return_type(before: &str) -> Option<String> {
    let before = before.trim();
    // A struct or array return type ends the text: `{ ptr, i64 }`.
    if before.ends_with('}') || before.ends_with(']') || before.ends_with('>') {
        let close = before.chars().last()?;
        let open = match close {
            '}' => '{',
            ']' => '[',
            _ => '<',
        };
        return balanced(before.char_indices().rev(), &[close], &[open], false).map(|start| before[start..].to_owned());
    }
    before.split_whitespace().last().map(str::to_owned)
}

/// `call`/`invoke` in an instruction: the callee token, the return type, and where the
/// argument list opens.
fn call_site(rest: &str) -> Option<(&str, &str, usize)> {
    let after = ["tail call ", "musttail call ", "notail call ", "call ", "invoke "]
        .iter()
        .find_map(|p| rest.strip_prefix(p).map(|r| (rest.len() - r.len(), r)))?;
    let (offset, text) = after;
    // Calling-convention and return attributes, then the return type, then the callee.
    let mut words = Vec::new();
    let mut i = 0;
    let bytes = text.as_bytes();
    while i < text.len() {
        if bytes[i] == b' ' {
            i += 1;
            continue;
        }
        if bytes[i] == b'@' || bytes[i] == b'%' {
            let end = text[i..].find('(').map(|e| i + e)?;
            let callee = &text[i..end];
            let ret = words.last().copied().unwrap_or("void");
            return Some((callee, ret, offset + end));
        }
        let start = i;
        if matches!(bytes[i], b'{' | b'[' | b'<') {
            let ty = leading_type(&text[i..]);
            i += ty.len();
        } else {
            while i < text.len() && bytes[i] != b' ' {
                if bytes[i] == b'(' {
                    // An attribute with arguments: `align(8)`, `range(i8 0, 2)`.
                    i = matching_paren(text, i).map(|c| c + 1).unwrap_or(text.len());
                    continue;
                }
                i += 1;
            }
        }
        words.push(&text[start..i]);
    }
    None
}

/// `@name = [linkage ...] (global|constant) <type> <initialiser>, align N`
fn parse_global(unit: u32, line: &str) -> Option<Global> {
    let name = symbol_after_at(line, 0)?;
    let (_, rest) = line.split_once(" = ")?;
    let words: Vec<&str> = rest.split_whitespace().collect();
    if words.contains(&"external") && !rest.contains('@') {
        return None;
    }
    let writable = words.iter().take_while(|w| **w != "constant").any(|w| *w == "global");
    let symbol = qualify(unit, &name);
    let vtable = name.starts_with("vtable.");
    // The initialiser's fields with their offsets: walk the top-level `<{ ... }>` fields.
    let mut slots = Vec::new();
    if let Some(init_at) = rest.find("<{").and_then(|first| rest[first + 2..].find("<{").map(|s| first + 2 + s)) {
        let inner = &rest[init_at + 2..];
        let end = inner.rfind("}>").unwrap_or(inner.len());
        layout(unit, &inner[..end], 0, &mut slots);
    } else {
        for (_, symbol) in symbols(rest) {
            slots.push((0, qualify(unit, &symbol)));
        }
    }
    Some(Global { symbol, vtable, writable, slots })
}

/// Offsets of the fields of a packed constant `ty val, ty val, ...` (rustc's constants are
/// `<{ ... }>` of `ptr`, `[N x i8]` and nested packed structs, without padding).
fn layout(unit: u32, fields: &str, base: u64, out: &mut Vec<(u64, Symbol)>) -> u64 {
    let mut offset = base;
    for field in split_top(fields) {
        let ty = leading_type(field);
        let value = field[ty.len()..].trim();
        if ty == "ptr" {
            if let Some(name) = value.strip_prefix('@').and_then(|_| symbol_after_at(value, 0)) {
                out.push((offset, qualify(unit, &name)));
            } else {
                // `getelementptr inbounds (i8, ptr @x, i64 16)` and the like: the symbol inside.
                for (_, name) in symbols(value) {
                    out.push((offset, qualify(unit, &name)));
                }
            }
            offset += 8;
        } else if let Some(n) = array_len(&ty) {
            offset += n;
        } else if ty.starts_with("<{") {
            if let Some(inner) = value.strip_prefix("<{").and_then(|v| v.strip_suffix("}>")) {
                layout(unit, inner.trim(), offset, out);
            }
            offset += type_size(&ty);
        } else {
            offset += scalar_size(&ty);
        }
    }
    offset
}

fn type_size(ty: &str) -> u64 {
    if ty == "ptr" {
        8
    } else if let Some(n) = array_len(ty) {
        n
    } else if let Some(inner) = ty.strip_prefix("<{").and_then(|t| t.strip_suffix("}>")) {
        split_top(inner).into_iter().map(|f| type_size(&leading_type(f))).sum()
    } else {
        scalar_size(ty)
    }
}

/// `[N x i8]`: N bytes.
fn array_len(ty: &str) -> Option<u64> {
    let inner = ty.strip_prefix('[')?.strip_suffix(']')?;
    let (n, elem) = inner.split_once(" x ")?;
    Some(n.trim().parse::<u64>().ok()? * type_size(elem.trim()))
}

fn scalar_size(ty: &str) -> u64 {
    match ty {
        "i1" | "i8" => 1,
        "i16" => 2,
        "i32" | "float" => 4,
        "i64" | "double" | "ptr" => 8,
        "i128" => 16,
        _ => 8,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UNIT: &str = r#"
@vtable.0 = private unnamed_addr constant <{ ptr, [16 x i8], ptr, ptr }> <{ ptr @_RNvdrop, [16 x i8] c"\08\00\00\00\00\00\00\00\08\00\00\00\00\00\00\00", ptr @_RNvA3run, ptr @_RNvA4stop }>, align 8
@_RNvCs1_3lib4HOOK = internal global <{ [24 x i8] }> zeroinitializer, align 8
@alloc_1 = private unnamed_addr constant <{ ptr, [8 x i8], ptr }> <{ ptr @alloc_2, [8 x i8] c"\04\00\00\00\00\00\00\00", ptr @_RNvCs1_3lib8validate }>, align 8

define i32 @_RNvCs1_3lib4tool(ptr align 8 %x.0, ptr align 8 %x.1) unnamed_addr #0 !dbg !10 {
start:
  %0 = getelementptr inbounds i8, ptr %x.1, i64 24
  %1 = load ptr, ptr %0, align 8, !invariant.load !5, !nonnull !5
  %2 = call i32 %1(ptr align 1 %x.0), !dbg !12
  %3 = call { ptr, i64 } @_RNvCs1_3lib6helper(ptr @_RNvCs1_3lib4HOOK), !dbg !13
  store ptr @_RNvCs1_3lib7closure, ptr %p, align 8
  %4 = load ptr, ptr %p, align 8
  invoke void %4(ptr sret([24 x i8]) align 8 %r, i64 %n)
          to label %bb1 unwind label %cleanup, !dbg !13
  call void @llvm.dbg.declare(metadata ptr %x, metadata !1, metadata !DIExpression())
  ret i32 %2
}

declare void @_RNvNtCs2_3std7process4exit(i32)

!7 = !DIFile(filename: "src/lib.rs", directory: "/x")
!10 = distinct !DISubprogram(name: "tool", scope: !7, file: !7, line: 4, type: !8)
!12 = !DILocation(line: 5, column: 3, scope: !10)
!13 = !DILocation(line: 6, column: 9, scope: !14)
!14 = distinct !DILexicalBlock(scope: !10, file: !7, line: 6, column: 1)
"#;

    #[test]
    fn reads_calls_slots_pointers_addresses_and_lines() {
        let mut module = Module::default();
        module.add_unit(UNIT);
        let tool = &module.functions["_RNvCs1_3lib4tool"];
        assert_eq!(tool.signature, Signature(Some(("i32".into(), vec!["ptr".into(), "ptr".into()]))));
        let kinds: Vec<&UseKind> = tool.uses.iter().map(|u| &u.kind).collect();
        assert_eq!(
            kinds,
            vec![
                &UseKind::Virtual {
                    slot: 3,
                    signature: Signature(Some(("i32".into(), vec!["ptr".into()]))),
                    source: None
                },
                &UseKind::Call("_RNvCs1_3lib6helper".into()),
                &UseKind::Address("_RNvCs1_3lib4HOOK".into()),
                &UseKind::Address("_RNvCs1_3lib7closure".into()),
                &UseKind::Pointer { signature: Signature(Some(("void".into(), vec!["ptr".into(), "i64".into()]))) },
            ]
        );
        assert_eq!(module.location(tool.uses[0].dbg.unwrap()), Some(("src/lib.rs".into(), 5)));
        assert_eq!(module.location(tool.uses[1].dbg.unwrap()), Some(("src/lib.rs".into(), 6)));
        // The `invoke`'s location is on its second line.
        assert_eq!(module.location(tool.uses[4].dbg.unwrap()), Some(("src/lib.rs".into(), 6)));
        assert_eq!(module.definition(tool), Some(("src/lib.rs".into(), 4)));
        let vtable = &module.globals["unit0:vtable.0"];
        assert!(vtable.vtable);
        assert_eq!(vtable.slot(0).map(String::as_str), Some("_RNvdrop"));
        assert_eq!(vtable.slot(3).map(String::as_str), Some("_RNvA3run"));
        assert_eq!(vtable.slot(4).map(String::as_str), Some("_RNvA4stop"));
        assert!(module.globals["_RNvCs1_3lib4HOOK"].writable);
        let alloc = &module.globals["unit0:alloc_1"];
        assert_eq!(alloc.slots, vec![(0, "unit0:alloc_2".into()), (16, "_RNvCs1_3lib8validate".into())]);
        assert!(module.declared.contains("_RNvNtCs2_3std7process4exit"));
    }
}
