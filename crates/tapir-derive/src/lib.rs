//! `#[derive(Tree)]` for [tapir](https://docs.rs/tapir)'s transforms over structures of
//! tensors (`tapir::func::tree`). Use it through tapir's cargo feature `derive`, which
//! re-exports it as `tapir::func::tree::Tree`; the generated code names `::tapir`.
//!
//! The struct has exactly one type parameter, the leaf `L`, and every field is a structure
//! of it (`L`, `Vec<L>`, `[L; N]`, a tuple, another derived struct). For
//! `struct Mlp<L> { w: L, layers: Vec<L> }` it generates
//!
//! ```text
//! impl<T: Float> Tree<T> for Mlp<Tensor<T>> {
//!     type Map<L> = Mlp<L>;            // what the function receives: Mlp<Var<'s, T>>
//!     type Grads = Mlp<Tensor<T>>;     // what comes back
//!     // check, record and grads visit the fields in declaration order
//! }
//! ```
//!
//! so the gradients of an `Mlp<Tensor<T>>` are an `Mlp<Tensor<T>>`. A struct that breaks
//! these rules gets a compile error naming the rule.

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as TokenStream2};
use quote::{format_ident, quote};
use syn::{parse_macro_input, Data, DeriveInput, Error, Fields, GenericParam, Index};

/// Implements `tapir::func::tree::Tree<T>` for `Self<Tensor<T>>` of a struct generic over
/// its leaf type (see the crate documentation).
#[proc_macro_derive(Tree)]
pub fn derive_tree(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    expand(&input).unwrap_or_else(Error::into_compile_error).into()
}

fn expand(input: &DeriveInput) -> syn::Result<TokenStream2> {
    let name = &input.ident;
    let params: Vec<&GenericParam> = input.generics.params.iter().collect();
    match params.as_slice() {
        [GenericParam::Type(t)] if t.bounds.is_empty() && input.generics.where_clause.is_none() => {}
        _ => {
            return Err(Error::new_spanned(
                &input.generics,
                "derive(Tree) needs exactly one type parameter, the leaf type, without bounds: `struct S<L> { .. }`",
            ))
        }
    }
    let Data::Struct(data) = &input.data else {
        return Err(Error::new(Span::call_site(), "derive(Tree) supports structs only"));
    };
    // Each field as (access in `self`, the path segment errors print).
    let fields: Vec<(TokenStream2, String)> = match &data.fields {
        Fields::Named(f) => f
            .named
            .iter()
            .map(|f| {
                let id = f.ident.as_ref().expect("a named field has a name");
                (quote!(#id), format!(".{id}"))
            })
            .collect(),
        Fields::Unnamed(f) => (0..f.unnamed.len())
            .map(|i| {
                let i = Index::from(i);
                (quote!(#i), format!(".{}", i.index))
            })
            .collect(),
        Fields::Unit => Vec::new(),
    };
    let access: Vec<&TokenStream2> = fields.iter().map(|(a, _)| a).collect();
    let segment: Vec<&String> = fields.iter().map(|(_, s)| s).collect();
    let build = |values: Vec<TokenStream2>| match &data.fields {
        Fields::Named(_) => quote!(#name { #(#access: #values),* }),
        Fields::Unnamed(_) => quote!(#name ( #(#values),* )),
        Fields::Unit => quote!(#name),
    };
    let record = build(
        access
            .iter()
            .map(|a| quote!(::tapir::func::tree::Tree::<__T>::record(&self.#a, __t.map(|__t| &__t.#a), __leaves)))
            .collect(),
    );
    let grads = build(access.iter().map(|a| quote!(::tapir::func::tree::Tree::<__T>::grads(&self.#a, __g)?)).collect());
    let map = format_ident!("__L");
    Ok(quote! {
        #[automatically_derived]
        #[allow(unused_variables)]
        impl<__T: ::tapir::Float> ::tapir::func::tree::Tree<__T> for #name<::tapir::Tensor<__T>> {
            type Map<#map> = #name<#map>;
            type Grads = #name<::tapir::Tensor<__T>>;

            fn check(&self, __t: &Self::Grads, __at: &mut ::tapir::func::tree::Position) -> ::tapir::Result<()> {
                #(__at.at(#segment, |__at| ::tapir::func::tree::Tree::<__T>::check(&self.#access, &__t.#access, __at))?;)*
                ::core::result::Result::Ok(())
            }

            fn record<'__s, '__g>(
                &'__g self,
                __t: ::core::option::Option<&'__g Self::Grads>,
                __leaves: &mut ::tapir::func::tree::Leaves<'__s, '__g, __T>,
            ) -> #name<::tapir::Var<'__s, __T>> {
                #record
            }

            fn grads(&self, __g: &mut ::tapir::func::tree::Gradients<'_, '_, __T>) -> ::tapir::Result<Self::Grads> {
                ::core::result::Result::Ok(#grads)
            }
        }
    })
}
