//! Models with `@embed` and `@head` around the pipelined layers.

use crate::common::{load, root};
use crate::grad::train_opts;
use ppc::passes::Remat;
use ppc::pipeline::compile;
use ppc_dialect::interp::{synthetic_targets, Interp};
use ppc_dialect::Overrides;

#[test]
fn training_step_is_the_same_on_one_and_two_ranks() {
    let text = std::fs::read_to_string(root().join("tests/models/tiny_lm.ppc")).expect("model");
    let step = |ranks| {
        let over = Overrides {
            ranks: Some(ranks),
            ..Overrides::default()
        };
        let mut m = load(&text, &over);
        compile(&mut m, &train_opts(true, Remat::Stage), None, None).expect("compiles");
        let inputs = Interp::new(&m, 3).synthetic_inputs();
        let targets = synthetic_targets(&m, 3);
        let source = ppc_runtime::init::Source::Seeded(3);
        ppc_dialect::grad::train_step_on_ranks(&m, 3, &source, &inputs, &targets).expect("runs")
    };
    let (one, two) = (step(1), step(2));
    assert_eq!(
        one.loss.to_bits(),
        two.loss.to_bits(),
        "{} vs {}",
        one.loss,
        two.loss
    );
}
