// The database handle never hands its pool outside the gateway (guard row G2, type privacy).
fn unscoped(db: &scopegate::store::Db) {
    let _pool = db.pool();
}

fn main() {}
