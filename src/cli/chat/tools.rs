//! The tools a chat offers (none, the demo tools, or a file's) and the
//! constraint that keeps the model's calls valid.

use anyhow::{Context, Result};
use cqlm::constrain::{Constraint, ConstraintSpec, TokenSpace, ToolChoice, ToolMarkers, ToolSet};
use serde_json::Value;
use std::path::PathBuf;

/// The tools offered to the model.
#[derive(Debug, Clone, Default)]
pub enum Tools {
    /// None: plain answers.
    #[default]
    Off,
    /// The four demo tools ([`cqlm::demo_tools`]), run in-process.
    Demo,
    /// An OpenAI tools array read from a file: demo tools in it run
    /// in-process, the others ask the user for their result.
    File(PathBuf, Value),
}

impl Tools {
    /// `off`, `demo`, or a file holding an OpenAI tools array.
    ///
    /// # Errors
    /// A file that cannot be read, is not JSON, or is not a valid tools array.
    pub fn parse(arg: &str) -> Result<Tools> {
        match arg {
            "off" | "none" => Ok(Tools::Off),
            "demo" => Ok(Tools::Demo),
            path => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("cannot read the tools file {path}"))?;
                let v: Value = serde_json::from_str(&text)
                    .with_context(|| format!("the tools file {path} is not valid JSON"))?;
                ToolSet::from_openai(&v).with_context(|| format!("the tools file {path}"))?;
                Ok(Tools::File(path.into(), v))
            }
        }
    }

    /// The OpenAI tools array, `None` when off.
    pub fn array(&self) -> Option<Value> {
        match self {
            Tools::Off => None,
            Tools::Demo => Some(cqlm::demo_tools::tools()),
            Tools::File(_, v) => Some(v.clone()),
        }
    }

    /// The tools in words, e.g. `demo (calculate, …)`.
    pub fn describe(&self) -> String {
        let names = |v: &Value| -> String {
            v.as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|t| t.pointer("/function/name").and_then(Value::as_str))
                        .collect::<Vec<_>>()
                        .join(", ")
                })
                .unwrap_or_default()
        };
        match self {
            Tools::Off => "off".into(),
            Tools::Demo => format!("demo ({})", names(&cqlm::demo_tools::tools())),
            Tools::File(p, v) => format!("{} ({})", p.display(), names(v)),
        }
    }

    /// The constraint of an answer that may call one tool between `markers`
    /// (tool choice auto), `None` when off.
    ///
    /// # Errors
    /// A tool set the constraint compiler cannot take.
    pub fn constraint(
        &self,
        space: &TokenSpace,
        markers: &ToolMarkers,
    ) -> Result<Option<Constraint>> {
        let Some(array) = self.array() else {
            return Ok(None);
        };
        let spec = ConstraintSpec::Tools {
            tools: ToolSet::from_openai(&array)?.with_markers(markers.clone()),
            choice: ToolChoice::Auto,
            parallel: false,
        };
        Ok(Some(space.compile(&spec)?))
    }
}
