"""What the families that read images through a Qwen-VL vision tower share (decision-vision, decision3):
``processor.py`` (the Qwen2-VL image processor and video frame pairs), ``grid.py`` (the vision core's
grid-shaped inputs and the text core's M-RoPE positions, in numpy), ``golden.py`` (the vision core's files in a
package and its recorded case). No family is named here.
"""
