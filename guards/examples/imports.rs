//! Prints the crate's cross-module references: `cargo run -p guards --example imports -- <root>`,
//! or its references between files with `--files` after the root.

fn main() {
    let root = std::env::args().nth(1).unwrap_or_else(|| ".".into());
    let options = guards::Options::new(root);
    let printed = if std::env::args().nth(2).as_deref() == Some("--files") {
        guards::file_imports(&options).map(|all| {
            for i in all {
                println!("{} -> {} {}:{} {}", i.file, i.to_file, i.file, i.line, i.path);
            }
        })
    } else {
        guards::imports(&options).map(|all| {
            for i in all {
                println!("{} -> {} {}:{} {}", i.from, i.to, i.file, i.line, i.path);
            }
        })
    };
    if let Err(e) = printed {
        eprintln!("{e}");
        std::process::exit(2);
    }
}
