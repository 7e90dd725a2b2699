//! The weights an entry reads, each one entry argument. Passes declare one weight in several
//! functions: `@stage`, `@stage_vjp` and `@stage_fwd` hold the same stacked weights, `@model`
//! and `@train_vjp` those of the ends, each as a parameter of the same name and type. This
//! table, computed before the walk from the functions the entry reaches, gives each weight one
//! [`ParamId`]; the walk binds a function's parameters by id.

use ppc_dialect::ir::{FuncId, Module, Param};
use ppc_dialect::{Diagnostic, Type};
use std::collections::HashMap;

/// One weight of the entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ParamId(usize);

/// A weight: its name (the manifest's and the parameter files'), type and declaration.
pub struct Weight {
    pub name: String,
    pub ty: Type,
    pub param: Param,
}

/// The weights of the functions an entry reaches.
pub struct Params {
    weights: Vec<Weight>,
    /// Parameter `i` of function `f` is weight `of[(f, i)]`.
    of: HashMap<(FuncId, usize), ParamId>,
}

impl Params {
    /// The weights of `entry` and of every function it calls, directly or not; parameters of
    /// one name are one weight, which they must declare alike.
    pub fn of(m: &Module, entry: FuncId) -> Result<Params, Diagnostic> {
        let mut params = Params {
            weights: Vec::new(),
            of: HashMap::new(),
        };
        let mut by_name: HashMap<&str, ParamId> = HashMap::new();
        for f in m.reachable(entry) {
            let g = &m.funcs[f];
            for (i, p) in g.params.iter().enumerate() {
                let (name, ty) = (g.values[p.value].name.as_str(), g.ty(p.value));
                let id = *by_name.entry(name).or_insert_with(|| {
                    params.weights.push(Weight {
                        name: name.to_string(),
                        ty: ty.clone(),
                        param: p.clone(),
                    });
                    ParamId(params.weights.len() - 1)
                });
                let first = &params.weights[id.0];
                if first.ty != *ty {
                    return Err(Diagnostic::plain(format!(
                        "parameter `%{name}` is {} in `@{}` but {} elsewhere: one name, one weight",
                        ty, g.name, first.ty
                    )));
                }
                params.of.insert((f, i), id);
            }
        }
        Ok(params)
    }

    /// The weight parameter `i` of function `f` declares.
    pub fn id(&self, f: FuncId, i: usize) -> ParamId {
        self.of[&(f, i)]
    }

    pub fn weight(&self, id: ParamId) -> &Weight {
        &self.weights[id.0]
    }
}
