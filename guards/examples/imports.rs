//! Prints the crate's cross-module references: `cargo run -p guards --example imports -- <root>`.

fn main() {
    let root = std::env::args().nth(1).unwrap_or_else(|| ".".into());
    match guards::imports(&guards::Options::new(root)) {
        Ok(all) => {
            for i in all {
                println!("{} -> {} {}:{} {}", i.from, i.to, i.file, i.line, i.path);
            }
        }
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    }
}
