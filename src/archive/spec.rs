//! SPEC §3: the tensors an archive must hold for a config.

use crate::model::config::Config;

/// What one logical tensor of SPEC §3 must be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TensorKind {
    /// A CQ matrix (`.codebook`, `.norms`, `.packed`) with `cols` fixed by its role and
    /// `rows` fixed (`Some`) or free (`None`: engram tables, any `>= 1`).
    Cq {
        /// Required output rows, or `None` for "any >= 1".
        rows: Option<usize>,
        /// Logical input columns.
        cols: usize,
    },
    /// A dense F32 tensor of exactly this shape.
    F32 {
        /// Required shape.
        shape: Vec<usize>,
    },
}

/// One logical tensor of SPEC §3.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    /// Its name (for a CQ matrix, without the `.codebook`/`.norms`/`.packed` suffix).
    pub name: String,
    /// Its kind and shape.
    pub kind: TensorKind,
}

/// The three stored tensors of a CQ matrix named `name`.
pub fn cq_parts(name: &str) -> [String; 3] {
    [
        format!("{name}.codebook"),
        format!("{name}.norms"),
        format!("{name}.packed"),
    ]
}

/// Names of the engram tables in gather order (orders as listed, heads ascending).
pub fn engram_table_names(config: &Config) -> Vec<String> {
    let Some(e) = &config.engram else {
        return Vec::new();
    };
    let mut names = Vec::with_capacity(e.tables());
    for n in &e.orders {
        for h in 0..e.hash_heads {
            names.push(format!("engram.table.{n}.{h}"));
        }
    }
    names
}

/// Every logical tensor that SPEC §3 requires for `config`, in a stable order.
pub fn expected_tensors(config: &Config) -> Vec<TensorSpec> {
    let h = config.hidden;
    let l = config.layers;
    let cq = |name: String, rows: usize, cols: usize| TensorSpec {
        name,
        kind: TensorKind::Cq {
            rows: Some(rows),
            cols,
        },
    };
    let f32t = |name: String, shape: Vec<usize>| TensorSpec {
        name,
        kind: TensorKind::F32 { shape },
    };
    let mut v = vec![
        cq("embed".into(), config.vocab, h),
        f32t("final_norm".into(), vec![h]),
        cq("mhc.phi_pre".into(), l * 4, 4 * h),
        cq("mhc.phi_post".into(), l * 4, 4 * h),
        cq("mhc.phi_res".into(), l * 16, 4 * h),
        f32t("mhc.a_pre".into(), vec![l]),
        f32t("mhc.a_post".into(), vec![l]),
        f32t("mhc.a_res".into(), vec![l]),
        f32t("mhc.b_pre".into(), vec![l, 4]),
        f32t("mhc.b_post".into(), vec![l, 4]),
        f32t("mhc.b_res".into(), vec![l, 16]),
    ];
    for i in 0..l {
        let p = |s: &str| format!("layers.{i}.{s}");
        v.push(f32t(p("attn_norm"), vec![h]));
        v.push(f32t(p("attn_post_norm"), vec![h]));
        v.push(f32t(p("mlp_norm"), vec![h]));
        v.push(cq(p("wq"), config.q_dim(), h));
        v.push(cq(p("wk"), config.kv_dim(), h));
        v.push(cq(p("wv"), config.kv_dim(), h));
        v.push(cq(p("wg"), config.q_dim(), h));
        v.push(cq(p("wo"), h, config.q_dim()));
        v.push(f32t(p("q_norm"), vec![config.head_dim]));
        v.push(f32t(p("k_norm"), vec![config.head_dim]));
        v.push(f32t(p("attn_out_scale"), vec![1]));
        v.push(f32t(p("mlp_d1"), vec![config.hadamard_dim]));
        v.push(f32t(p("mlp_d2"), vec![config.hadamard_dim]));
        v.push(f32t(p("mlp_d3"), vec![config.hadamard_dim]));
    }
    if let Some(e) = &config.engram {
        for name in engram_table_names(config) {
            v.push(TensorSpec {
                name,
                kind: TensorKind::Cq {
                    rows: None,
                    cols: e.dim,
                },
            });
        }
        for s in &e.sites {
            v.push(cq(format!("engram.{s}.wk"), h, e.e_dim()));
            v.push(cq(format!("engram.{s}.wv"), h, e.e_dim()));
            v.push(f32t(format!("engram.{s}.conv"), vec![e.taps, h]));
            v.push(f32t(format!("engram.{s}.norm_u"), vec![h]));
            v.push(f32t(format!("engram.{s}.norm_k"), vec![h]));
        }
    }
    v
}
