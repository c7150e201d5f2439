//! Runs the guard on a crate from the command line and prints what a build would:
//! `cargo run -p guards --example check -- <crate root> [tool module ...]`.
//! Exits 1 when anything is found, 2 when the guard cannot run.

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(root) = args.next() else {
        eprintln!("usage: check <crate root> [tool module ...]");
        std::process::exit(2);
    };
    let modules: Vec<String> = args.collect();
    let mut opts = guards::Options::new(&root).tool_modules(modules);
    let rules = std::path::Path::new(&root).join("guards/rules.toml");
    if rules.is_file() {
        opts = opts.rules(rules);
    }
    let report = match guards::check(&opts) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("the guard could not run: {e}");
            std::process::exit(2);
        }
    };
    println!(
        "{} files parsed, {} tool roots, {} findings",
        report.files.len(),
        report.tools.len(),
        report.findings.len()
    );
    for t in &report.tools {
        println!("  root {} ({}:{})", t.name, t.file, t.line);
    }
    if let Some(msg) = guards::failure_message(&report) {
        println!("{msg}");
        std::process::exit(1);
    }
}
