"""Operators' work decompositions: the rules an operator's graph builder (ptsolve.ops) and its emitters
(codegen.cuda, codegen.hip) share (which CTAs exist, what each covers, how a tile is staged). Part of the
vocabulary: the lowering and the back-ends read these, never the builders."""
